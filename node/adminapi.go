package node

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

const (
	// headerForwarded marks an admin write one node forwarded to the
	// leader; the leader never forwards it again.
	headerForwarded = "X-Warmroute-Forwarded"
	// writeRetryFor bounds how long a write waits for a leader.
	writeRetryFor = 10 * time.Second
	// maxAdminBody bounds admin request bodies.
	maxAdminBody = 1 << 20
)

// authorize enforces the admin token. With a token configured, writes need
// it from anywhere and reads need it from off loopback. Without one,
// writes are accepted from loopback clients only and reads from anywhere
// the admin listener is reachable. It answers the request and returns false
// when it is refused.
//
// A write another router forwarded is authorized by that router (it
// checked the operator's token, or its loopback) when the router proves
// its name with its cluster certificate; without cluster identities the
// rules above apply to it as to any request.
func (n *Node) authorize(w http.ResponseWriter, r *http.Request, write bool) bool {
	if r.Header.Get(headerForwarded) != "" {
		by, ok := n.forwardedBy(r)
		if !ok {
			writeJSONError(w, http.StatusForbidden, "forwarded_write_unproven",
				"a forwarded admin write must come from a router proving its name with its cluster certificate")
			return false
		}
		if write && n.identity != nil && by != "" {
			return true
		}
	}
	loopback := isLoopbackRemote(r.RemoteAddr)
	if n.adminToken == "" {
		if write && !loopback {
			writeJSONError(w, http.StatusForbidden, "admin_token_required",
				"admin writes from other hosts need a token: start the routers with --admin-token-file or WARMROUTE_ADMIN_TOKEN")
			return false
		}
		return true
	}
	if !write && loopback {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(n.adminToken)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="warmroute-admin"`)
		writeJSONError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong admin bearer token")
		return false
	}
	return true
}

func isLoopbackRemote(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// guarded wraps a handler with authorize.
func (n *Node) guarded(write bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if n.authorize(w, r, write) {
			h(w, r)
		}
	}
}

// registerAdminAPI adds the backend, config and cluster endpoints.
func (n *Node) registerAdminAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/backends", n.guarded(false, n.handleListBackends))
	mux.HandleFunc("GET /v1/backends/{id}", n.guarded(false, n.handleGetBackend))
	mux.HandleFunc("POST /v1/backends", n.guarded(true, n.handleUpsertBackend))
	mux.HandleFunc("DELETE /v1/backends/{id}", n.guarded(true, n.handleRemoveBackend))
	mux.HandleFunc("POST /v1/backends/{id}/{action}", n.guarded(true, n.handleBackendState))
	mux.HandleFunc("GET /v1/config", n.guarded(false, n.handleGetConfig))
	mux.HandleFunc("PATCH /v1/config", n.guarded(true, n.handlePatchConfig))
	mux.HandleFunc("PUT /v1/config", n.guarded(true, n.handlePutConfig))
	mux.HandleFunc("GET /v1/cluster", n.guarded(false, n.handleCluster))
}

// BackendView is a backend as the admin API shows it: the agreed record
// and this node's live view of it.
type BackendView struct {
	cluster.Backend
	Live *proxy.BackendStatus `json:"live,omitempty"`
	// FailingOn names the other router nodes that see the backend failing
	// (their health checks or passive ejection, as gossip carries it); the
	// leader commits it down when most nodes do.
	FailingOn []string `json:"failing_on,omitempty"`
}

func (n *Node) backendViews() ([]BackendView, uint64) {
	st, epoch := n.agree.State()
	live := map[string]proxy.BackendStatus{}
	for _, s := range n.proxy.Status() {
		live[s.ID] = s
	}
	out := make([]BackendView, len(st.Backends))
	for i, b := range st.Backends {
		out[i].Backend = b
		if s, ok := live[b.ID]; ok {
			out[i].Live = &s
		}
		if n.gossip != nil {
			out[i].FailingOn = n.gossip.View().Health(b.ID).Failing
		}
	}
	return out, epoch
}

func (n *Node) handleListBackends(w http.ResponseWriter, r *http.Request) {
	bs, epoch := n.backendViews()
	writeJSON(w, http.StatusOK, map[string]any{"epoch": epoch, "backends": bs})
}

func (n *Node) handleGetBackend(w http.ResponseWriter, r *http.Request) {
	bs, epoch := n.backendViews()
	for _, b := range bs {
		if b.ID == r.PathValue("id") {
			writeJSON(w, http.StatusOK, map[string]any{"epoch": epoch, "backend": b})
			return
		}
	}
	writeJSONError(w, http.StatusNotFound, "unknown_backend", fmt.Sprintf("no backend %q", r.PathValue("id")))
}

// backendRequest is the body of POST /v1/backends.
type backendRequest struct {
	ID     string            `json:"id"`
	URL    string            `json:"url"`
	Zone   string            `json:"zone"`
	Weight int               `json:"weight"`
	State  string            `json:"state"`
	Labels map[string]string `json:"labels"`
}

// decodeStrict reads a JSON body, refusing unknown fields and trailing
// data.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	if dec.More() {
		return errors.New("request body: trailing data after the JSON object")
	}
	return nil
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		writeJSONError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
		return nil, false
	}
	return b, true
}

// ParseBackendRequest checks an add-backend body and returns the command.
// The ID defaults to the URL's host:port.
func ParseBackendRequest(body []byte) (cluster.Command, error) {
	var req backendRequest
	if err := decodeStrict(body, &req); err != nil {
		return cluster.Command{}, err
	}
	spec := BackendSpec{ID: req.ID, URL: req.URL, Zone: req.Zone, Weight: req.Weight}
	rb, err := spec.RingBackend()
	if err != nil {
		return cluster.Command{}, err
	}
	return cluster.UpsertBackend(cluster.Backend{ID: rb.ID, URL: rb.Addr, Zone: rb.Zone, Weight: rb.Weight,
		State: req.State, Labels: req.Labels}), nil
}

func (n *Node) handleUpsertBackend(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	cmd, err := ParseBackendRequest(body)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_backend", err.Error())
		return
	}
	n.write(w, r, body, cmd)
}

func (n *Node) handleRemoveBackend(w http.ResponseWriter, r *http.Request) {
	n.write(w, r, nil, cluster.RemoveBackend(r.PathValue("id")))
}

func (n *Node) handleBackendState(w http.ResponseWriter, r *http.Request) {
	var state string
	switch r.PathValue("action") {
	case "drain":
		state = cluster.StateDraining
	case "activate", "undrain":
		state = cluster.StateActive
	case "down":
		state = cluster.StateDown
	default:
		writeJSONError(w, http.StatusNotFound, "not_found", "unknown backend action "+r.PathValue("action")+" (want drain, activate or down)")
		return
	}
	n.write(w, r, nil, cluster.SetBackendState(r.PathValue("id"), state))
}

func (n *Node) handleGetConfig(w http.ResponseWriter, r *http.Request) {
	st, epoch := n.agree.State()
	writeJSON(w, http.StatusOK, map[string]any{"epoch": epoch, "routing": st.Routing})
}

// ParseRoutingPatch merges a JSON object of routing fields over cur (over
// the defaults when replace is set), by their admin API names or
// SageMaker's (RoutingStrategy, PrefixLength, ConcurrencyThreshold). A
// field named twice, under either name, is an error.
func ParseRoutingPatch(cur ring.Settings, body []byte, replace bool) (ring.Settings, error) {
	raw, err := objectFields(body)
	if err != nil {
		return cur, fmt.Errorf("request body: %w", err)
	}
	out := cur
	if replace {
		out = ring.DefaultSettings()
	}
	given := map[string]string{} // setting -> the name it was given as
	for _, f := range raw {
		info, ok := ring.LookupSetting(f.name)
		if !ok {
			return cur, fmt.Errorf("unknown routing field %q", f.name)
		}
		if prev, dup := given[info.JSON]; dup {
			if prev == f.name {
				return cur, fmt.Errorf("routing field %q given twice", f.name)
			}
			return cur, fmt.Errorf("routing field %q given twice, as %q and %q: give it once", info.JSON, prev, f.name)
		}
		given[info.JSON] = f.name
		if err := json.Unmarshal(f.value, out.Field(info)); err != nil {
			return cur, fmt.Errorf("routing field %q: %w", f.name, err)
		}
	}
	if err := out.Validate(); err != nil {
		return cur, err
	}
	return out, nil
}

// field is one member of a JSON object, in order.
type field struct {
	name  string
	value json.RawMessage
}

// objectFields reads a JSON object's members in order, duplicates
// included (encoding/json keeps the last of a duplicated key silently).
func objectFields(body []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil {
		return nil, err
	} else if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, errors.New("want a JSON object")
	}
	var out []field
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := t.(string)
		if !ok {
			return nil, errors.New("want a JSON object")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, field{name: name, value: v})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	return out, nil
}

func (n *Node) handlePatchConfig(w http.ResponseWriter, r *http.Request) { n.setConfig(w, r, false) }
func (n *Node) handlePutConfig(w http.ResponseWriter, r *http.Request)   { n.setConfig(w, r, true) }

func (n *Node) setConfig(w http.ResponseWriter, r *http.Request, replace bool) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	st, _ := n.agree.State()
	rt, err := ParseRoutingPatch(st.Routing, body, replace)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_config", err.Error())
		return
	}
	n.write(w, r, body, cluster.SetRouting(rt))
}

// ClusterView is GET /v1/cluster.
type ClusterView struct {
	Node    string            `json:"node"`
	Epoch   uint64            `json:"epoch"`
	Raft    cluster.Status    `json:"raft"`
	Members []memberView      `json:"members,omitempty"`
	Leader  string            `json:"leader,omitempty"`
	Admins  map[string]string `json:"admin_addrs,omitempty"`
}

type memberView struct {
	Name      string `json:"name"`
	Addr      string `json:"addr"`
	State     string `json:"state"`
	Zone      string `json:"zone,omitempty"`
	AdminAddr string `json:"admin_addr,omitempty"`
	RaftAddr  string `json:"raft_addr,omitempty"`
	Version   string `json:"version,omitempty"`
}

func (n *Node) clusterView() ClusterView {
	_, epoch := n.agree.State()
	v := ClusterView{Node: n.name, Epoch: epoch, Raft: n.agree.Status()}
	v.Leader = v.Raft.LeaderID
	if n.gossip != nil {
		for _, m := range n.gossip.Members() {
			v.Members = append(v.Members, memberView{Name: m.Name, Addr: m.Addr, State: m.State, Zone: m.Meta.Zone,
				AdminAddr: m.Meta.AdminAddr, RaftAddr: m.Meta.RaftAddr, Version: m.Meta.Version})
		}
	}
	return v
}

func (n *Node) handleCluster(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.clusterView())
}

// write commits cmd, forwarding it to the leader when this node is not the
// leader and retrying with jitter while there is none. body is the original
// request body, sent on when forwarding. A forward that has not answered
// when Raft names another leader (the old one paused or cut off) is
// abandoned and sent to the new one: commands are idempotent.
func (n *Node) write(w http.ResponseWriter, r *http.Request, body []byte, cmd cluster.Command) {
	ctx, cancel := context.WithTimeout(r.Context(), writeRetryFor)
	defer cancel()
	for attempt := 0; ; attempt++ {
		epoch, err := n.agree.Apply(ctx, cmd)
		switch {
		case err == nil:
			n.waitEpoch(ctx, epoch, 2*time.Second)
			writeJSON(w, http.StatusOK, map[string]any{"epoch": epoch, "node": n.name})
			return
		case errors.Is(err, cluster.ErrInvalid):
			writeJSONError(w, http.StatusBadRequest, "invalid_request", err.Error())
			return
		case errors.Is(err, cluster.ErrUnknownBackend):
			writeJSONError(w, http.StatusNotFound, "unknown_backend", err.Error())
			return
		case errors.Is(err, cluster.ErrHalted):
			writeJSONError(w, http.StatusServiceUnavailable, "agreement_halted", "this router stopped applying the Raft log: "+err.Error())
			return
		case errors.Is(err, cluster.ErrNotLeader) && r.Header.Get(headerForwarded) == "":
			if id, addr := n.leaderAdmin(); addr != "" {
				if n.forward(ctx, w, r, body, id, addr) {
					return
				}
			}
		case errors.Is(err, cluster.ErrNotLeader), errors.Is(err, cluster.ErrNoLeader):
		default:
			if ctx.Err() == nil && !errors.Is(err, cluster.ErrClosed) {
				n.log.Warn("admin write", "op", cmd.Op, "err", err)
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
func (n *Node) leaderAdmin() (id, addr string) {
	id, _ = n.agree.Leader()
	if id == "" || n.gossip == nil {
		return "", ""
	}
	for _, m := range n.gossip.Members() {
		if m.Name == id {
			return id, m.Meta.AdminAddr
		}
	}
	return "", ""
}

// forward sends the write to the leader's admin API and relays its answer.
// It returns false when the leader could not be reached, or Raft named
// another leader before it answered (the caller retries).
func (n *Node) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte, leader, addr string) bool {
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
				if id, _ := n.agree.Leader(); id != "" && id != leader {
					close(moved)
					cancel()
					return
				}
			}
		}
	}()
	defer func() { cancel(); <-watchDone }()
	req, err := http.NewRequestWithContext(fctx, r.Method, n.adminScheme+"://"+addr+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return false
	}
	for _, h := range []string{"Authorization", "Content-Type"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set(headerForwarded, n.name)
	resp, err := n.forwardClient(leader).Do(req)
	if err != nil {
		select {
		case <-moved:
			n.log.Debug("the leader changed while a write was forwarded to it; forwarding to the new one", "old", leader)
		default:
			n.log.Debug("forwarding an admin write", "leader", addr, "err", err)
		}
		return false
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminBody))
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
		n.waitEpoch(ctx, ack.Epoch, 2*time.Second)
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
func (n *Node) waitEpoch(ctx context.Context, epoch uint64, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		if _, e := n.proxy.Ring(); e >= epoch || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}
