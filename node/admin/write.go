package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/node/cluster"
)

// write commits cmd, forwarding it to the leader when this node is not the
// leader and retrying with jitter while there is none. body is the original
// request body, sent on when forwarding. A forward that has not answered
// when Raft names another leader (the old one paused or cut off) is
// abandoned and sent to the new one: commands are idempotent.
func (s *Server) write(w http.ResponseWriter, r *http.Request, body []byte, cmd cluster.Command) {
	ctx, cancel := context.WithTimeout(r.Context(), writeRetryFor)
	defer cancel()
	for attempt := 0; ; attempt++ {
		epoch, err := s.cfg.Agreement.Apply(ctx, cmd)
		switch {
		case err == nil:
			s.waitEpoch(ctx, epoch, 2*time.Second)
			writeJSON(w, http.StatusOK, WriteResult{Epoch: epoch, Node: s.cfg.Name})
			return
		case errors.Is(err, cluster.ErrInvalid):
			writeJSONError(w, http.StatusBadRequest, "invalid_request", err.Error())
			return
		case errors.Is(err, cluster.ErrUnknownBackend):
			writeJSONError(w, http.StatusNotFound, "unknown_backend", err.Error())
			return
		case errors.Is(err, cluster.ErrVersionSkew):
			writeJSONError(w, http.StatusConflict, "version_skew", err.Error())
			return
		case errors.Is(err, cluster.ErrHalted):
			writeJSONError(w, http.StatusServiceUnavailable, "agreement_halted", "this router stopped applying the Raft log: "+err.Error())
			return
		case errors.Is(err, cluster.ErrNotLeader) && r.Header.Get(headerForwarded) == "":
			if id, addr := s.leaderAdmin(); addr != "" {
				if s.forward(ctx, w, r, body, id, addr) {
					return
				}
			}
		case errors.Is(err, cluster.ErrNotLeader), errors.Is(err, cluster.ErrNoLeader):
		default:
			if ctx.Err() == nil && !errors.Is(err, cluster.ErrClosed) {
				s.log.Warn("admin write", "op", cmd.Op, "err", err)
			}
			if errors.Is(err, cluster.ErrClosed) {
				writeJSONError(w, http.StatusServiceUnavailable, "shutting_down", "this router is shutting down")
				return
			}
		}
		// No leader (yet), or the leader moved: wait and retry.
		delay := time.Duration(50+rand.IntN(200)) * time.Millisecond
		select {
		case <-ctx.Done():
			writeJSONError(w, http.StatusServiceUnavailable, "no_leader",
				fmt.Sprintf("no Raft leader accepted the write within %s (last error: %v); the cluster keeps routing on its last agreed ring", writeRetryFor, err))
			return
		case <-time.After(delay):
		}
	}
}

// leaderAdmin returns the current leader's name and its admin address
// from gossip metadata.
func (s *Server) leaderAdmin() (id, addr string) {
	id, _ = s.cfg.Agreement.Leader()
	if id == "" || s.cfg.Members == nil {
		return "", ""
	}
	for _, m := range s.cfg.Members.Members() {
		if m.Name == id {
			return id, m.Meta.AdminAddr
		}
	}
	return "", ""
}

// forward sends the write to the leader's admin API and relays its answer.
// It returns false when the leader could not be reached, or Raft named
// another leader before it answered (the caller retries).
func (s *Server) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte, leader, addr string) bool {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	moved := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		t := time.NewTicker(leaderPoll)
		defer t.Stop()
		for {
			select {
			case <-fctx.Done():
				return
			case <-t.C:
				if id, _ := s.cfg.Agreement.Leader(); id != "" && id != leader {
					close(moved)
					cancel()
					return
				}
			}
		}
	}()
	defer func() { cancel(); <-watchDone }()
	req, err := http.NewRequestWithContext(fctx, r.Method, s.scheme+"://"+addr+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return false
	}
	for _, h := range []string{"Authorization", "Content-Type"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set(headerForwarded, s.cfg.Name)
	resp, err := s.forwardClient(leader).Do(req)
	if err != nil {
		select {
		case <-moved:
			s.log.Debug("the leader changed while a write was forwarded to it; forwarding to the new one", "old", leader)
		default:
			s.log.Debug("forwarding an admin write", "leader", addr, "err", err)
		}
		return false
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return false
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return false // the leader lost its leadership meanwhile
	}
	// Read your writes on this node: wait briefly until it applied the
	// epoch the leader reports.
	var ack struct {
		Epoch uint64 `json:"epoch"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(out, &ack) == nil {
		s.waitEpoch(ctx, ack.Epoch, 2*time.Second)
	}
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("X-Warmroute-Leader", addr)
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
	return true
}

// leaderPoll is how often a forward checks whether Raft moved on to
// another leader.
const leaderPoll = 50 * time.Millisecond

// waitEpoch waits until this node routes on a ring of at least epoch, or d
// passes, so a client that wrote through this node then sends traffic to it
// sees its change.
func (s *Server) waitEpoch(ctx context.Context, epoch uint64, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		if _, e := s.cfg.Router.Ring(); e >= epoch || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// forwardClient is the HTTP client that forwards an admin write to the
// leader at addr. With a cluster identity it speaks HTTPS with this
// router's certificate and accepts only the router named leader: gossip
// metadata, where the leader's admin address comes from, is not proof of
// who listens there, and the request carries the operator's token.
func (s *Server) forwardClient(leader string) *http.Client {
	if s.cfg.Identity == nil {
		return s.client
	}
	tr := &http.Transport{
		TLSClientConfig:     s.cfg.Identity.ClientConfig(identity.ExpectName(leader)),
		DialContext:         (&net.Dialer{Timeout: forwardDialTimeout}).DialContext,
		TLSHandshakeTimeout: forwardDialTimeout,
		DisableKeepAlives:   true,
	}
	return &http.Client{Transport: tr, Timeout: s.client.Timeout}
}

// forwardDialTimeout bounds connecting to the leader's admin API.
const forwardDialTimeout = 2 * time.Second

// forwardedBy returns the router that forwarded r, proven by its client
// certificate, and whether r may be treated as forwarded. Without cluster
// identities the header is taken at its word (loopback or trusted
// networks only).
func (s *Server) forwardedBy(r *http.Request) (string, bool) {
	claimed := r.Header.Get(headerForwarded)
	if claimed == "" {
		return "", true
	}
	if s.cfg.Identity == nil {
		return claimed, true
	}
	if r.TLS == nil {
		return "", false
	}
	// The chain was verified in the handshake; the revocation list is
	// checked again, as a kept-alive connection outlives it.
	name, err := s.cfg.Identity.CheckPeer(*r.TLS)
	if err != nil || name != claimed {
		return "", false
	}
	return name, true
}
