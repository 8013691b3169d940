package cluster

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// logged runs fn, which logs one Raft message through h, and returns the
// slog level it came out at ("" when nothing was logged).
func logged(t *testing.T, h *hclogAdapter, fn func()) string {
	t.Helper()
	var buf bytes.Buffer
	h.log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fn()
	out := buf.String()
	if i := strings.Index(out, "level="); i >= 0 {
		out = out[i+len("level="):]
		return out[:strings.IndexByte(out, ' ')]
	}
	return ""
}

func TestRaftLogLevels(t *testing.T) {
	h := newHclog(slog.New(slog.DiscardHandler), "raft").(*hclogAdapter)
	cases := []struct {
		name string
		log  func()
		want string
	}{
		{"first election", func() {
			h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
		}, "DEBUG"},
		{"leader lost", func() {
			h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "10.0.0.1:7947", "last-leader-id", "router-0")
		}, "WARN"},
		{"before bootstrap", func() { h.Warn("no known peers, aborting election") }, "DEBUG"},
		{"catching a follower up", func() {
			h.Warn("appendEntries rejected, sending older logs", "peer", raft.Server{ID: "b", Address: "127.0.0.1:2"}, "next", 1)
		}, "DEBUG"},
		{"new follower", func() {
			h.Warn("failed to get previous log", "previous-index", 1, "last-index", 0, "error", raft.ErrLogNotFound)
		}, "DEBUG"},
		{"own transport closing", func() {
			h.Error("failed to decode incoming command", "error", raft.ErrTransportShutdown)
		}, "DEBUG"},
		{"bad command", func() {
			h.Error("failed to decode incoming command", "error", errors.New("unknown rpc type 9"))
		}, "ERROR"},
		{"quorum lost", func() { h.Warn("failed to contact quorum of nodes, stepping down") }, "WARN"},
		{"server leaving", func() {
			h.Warn("unable to get address for server, using fallback address", "id", raft.ServerID("router-0"), "fallback", "127.0.0.1:1", "error", errors.New("no gossip address"))
		}, "DEBUG"},
		{"info", func() { h.Info("entering follower state") }, "DEBUG"},
		{"storage", func() { h.Error("failed to append to logs", "error", errors.New("disk full")) }, "ERROR"},
	}
	for _, c := range cases {
		if got := logged(t, h, c.log); got != c.want {
			t.Errorf("%s: logged at %q, want %q", c.name, got, c.want)
		}
	}
}

// TestPeerFailureGrace: a peer that cannot be reached is reported at
// debug while it may be restarting or leaving, at its own level once it
// stays unreachable, and gets a new grace period after it recovers.
func TestPeerFailureGrace(t *testing.T) {
	h := newHclog(slog.New(slog.DiscardHandler), "raft").(*hclogAdapter)
	fail := func() string {
		return logged(t, h, func() {
			h.Error("failed to heartbeat to", "peer", raft.ServerAddress("127.0.0.1:7001"), "backoff time", 10*time.Millisecond, "error", errors.New("EOF"))
		})
	}
	if got := fail(); got != "DEBUG" {
		t.Fatalf("first failure logged at %q, want DEBUG", got)
	}
	// The same peer in another message and form shares the run.
	if got := logged(t, h, func() {
		h.Error("failed to appendEntries to", "peer", raft.Server{ID: "b", Address: "127.0.0.1:7001"}, "error", errors.New("EOF"))
	}); got != "DEBUG" {
		t.Fatalf("failure within the grace period logged at %q, want DEBUG", got)
	}

	p := newPeerFailures()
	t0 := time.Unix(1000, 0)
	step := peerQuiet - time.Millisecond // failures close enough to form one run
	for _, s := range []struct {
		at      time.Duration
		failing bool
	}{
		{0, false},
		{step, false},
		{2 * step, true},                // past peerGrace
		{2*step + 10*time.Second, true}, // reported runs tolerate Raft's longest backoff
		{2*step + 10*time.Second + peerReset + time.Second, false},                           // recovered, then failed again
		{2*step + 10*time.Second + peerReset + time.Second + peerQuiet + time.Second, false}, // a brief failure, then another: two runs
	} {
		if got := p.failing("127.0.0.1:7001", t0.Add(s.at)); got != s.failing {
			t.Errorf("at %v: failing = %v, want %v", s.at, got, s.failing)
		}
	}
	if p.failing("127.0.0.1:7002", t0.Add(peerGrace+2*time.Second)) {
		t.Error("another peer's failures count against this one")
	}
}
