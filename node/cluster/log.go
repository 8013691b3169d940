package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// hclogAdapter sends Raft's and raft-wal's hclog output to slog. Raft
// reports routine events (state changes, elections) at info; they go to
// debug so a node stays quiet at info. Warnings and errors keep their
// level, except the ones Raft logs in the normal course of a healthy
// cluster (see routine) and a peer that cannot be reached for less than
// peerGrace (see peerFailures).
type hclogAdapter struct {
	log   *slog.Logger
	name  string
	args  []any
	peers *peerFailures // shared by every logger derived from one
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHclog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{log: l, name: name, peers: newPeerFailures()}
}

// routine lists the warnings Raft logs while a healthy cluster starts,
// elects, catches a follower up or adds a server: they go to debug.
var routine = map[string]bool{
	// Before the configuration is bootstrapped, or on a server not yet
	// added to it.
	"no known peers, aborting election":                   true,
	"not part of stable configuration, aborting election": true,
	"heartbeat timeout reached, not part of a stable configuration or a non-voter, not triggering a leader election": true,
	// Elections racing one another.
	"Election timeout reached, restarting election":                 true,
	"new leader elected, stepping down":                             true,
	"duplicate requestVote from":                                    true,
	"rejecting vote request since our last term is greater":         true,
	"rejecting vote request since our last index is greater":        true,
	"rejecting vote request since we have a leader":                 true,
	"rejecting pre-vote request since our last term is greater":     true,
	"rejecting pre-vote request since our last index is greater":    true,
	"rejecting pre-vote request since we have a leader":             true,
	"rejecting vote request since node is not in configuration":     true,
	"rejecting pre-vote request since node is not in configuration": true,
	// A leader finding where a follower's log ends (a new or lagging
	// follower).
	"failed to get previous log":                 true,
	"previous log term mis-match":                true,
	"appendEntries rejected, sending older logs": true,
}

// peerMessages are the messages Raft logs when it fails to reach a peer,
// with the argument that names the peer.
var peerMessages = map[string]string{
	"failed to appendEntries to":              "peer",
	"failed to heartbeat to":                  "peer",
	"failed to pipeline appendEntries":        "peer",
	"failed to start pipeline replication to": "peer",
	"failed to make requestVote RPC":          "target",
	"failed to contact":                       "server-id",
	// A server gossip no longer knows (it left or failed) but that is
	// still in the configuration.
	"unable to get address for server, using fallback address": "id",
}

// adjust returns the level to log a Raft message at.
func (h *hclogAdapter) adjust(l hclog.Level, msg string, args []any) hclog.Level {
	if l != hclog.Warn && l != hclog.Error {
		return l
	}
	switch {
	case routine[msg]:
		return hclog.Debug
	case msg == "heartbeat timeout reached, starting election" && argString(args, "last-leader-id") == "":
		// The first election after a start: no leader was lost.
		return hclog.Debug
	case msg == "failed to decode incoming command" || msg == "failed to accept connection":
		// This node's own transport closing.
		if err, _ := argValue(args, "error").(error); errors.Is(err, raft.ErrTransportShutdown) || errors.Is(err, net.ErrClosed) {
			return hclog.Debug
		}
	}
	if key, ok := peerMessages[msg]; ok && !h.peers.failing(peerName(argValue(args, key)), time.Now()) {
		return hclog.Debug
	}
	return l
}

func argValue(args []any, key string) any {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && k == key {
			return args[i+1]
		}
	}
	return nil
}

func argString(args []any, key string) string {
	switch v := argValue(args, key).(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// peerName names a peer by its address when Raft gives one.
func peerName(v any) string {
	switch p := v.(type) {
	case raft.Server:
		return string(p.Address)
	case *raft.Server:
		return string(p.Address)
	case raft.ServerAddress:
		return string(p)
	case raft.ServerID:
		return "id:" + string(p)
	case nil:
		return ""
	default:
		return fmt.Sprint(p)
	}
}

// Failures to reach one peer are logged at debug for their first
// peerGrace, and at their own level after that: a router that stops (a
// restart, a scale-down, a planned shutdown) is unreachable for a moment
// before the leader removes it from the configuration or it comes back,
// while one that stays unreachable is a problem to report. A run of
// failures ends when the peer has not failed for peerQuiet, or for
// peerReset once the run was reported (Raft backs off up to 10 s between
// attempts to reach a peer that stays down).
const (
	peerGrace = 5 * time.Second
	peerQuiet = 4 * time.Second
	peerReset = time.Minute
)

// peerFailures remembers, per peer, its current run of failures.
type peerFailures struct {
	mu    sync.Mutex
	peers map[string]failureRun
}

type failureRun struct {
	first, last time.Time
	reported    bool
}

func newPeerFailures() *peerFailures { return &peerFailures{peers: make(map[string]failureRun)} }

// failing records a failure to reach peer at now and reports whether the
// peer has been failing for at least peerGrace.
func (p *peerFailures) failing(peer string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.peers[peer]
	if gap := now.Sub(r.last); !ok || gap > peerReset || (!r.reported && gap > peerQuiet) {
		r = failureRun{first: now}
	}
	r.last = now
	r.reported = r.reported || now.Sub(r.first) >= peerGrace
	p.peers[peer] = r
	if len(p.peers) > 256 {
		for k, v := range p.peers {
			if now.Sub(v.last) > peerReset {
				delete(p.peers, k)
			}
		}
	}
	return r.reported
}

func (h *hclogAdapter) level(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace, hclog.Debug, hclog.Info, hclog.NoLevel:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (h *hclogAdapter) Log(l hclog.Level, msg string, args ...any) {
	if l == hclog.Off {
		return
	}
	lv := h.level(h.adjust(l, msg, args))
	ctx := context.Background()
	if !h.log.Enabled(ctx, lv) {
		return
	}
	all := make([]any, 0, len(h.args)+len(args)+2)
	all = append(all, "component", h.name)
	all = append(all, h.args...)
	all = append(all, args...)
	h.log.Log(ctx, lv, msg, all...)
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) enabled(l hclog.Level) bool {
	return h.log.Enabled(context.Background(), h.level(l))
}

func (h *hclogAdapter) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hclogAdapter) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hclogAdapter) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hclogAdapter) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hclogAdapter) IsError() bool { return h.enabled(hclog.Error) }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any(nil), h.args...), args...)
	return &c
}

func (h *hclogAdapter) Name() string { return h.name }

func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

// SetLevel is ignored: the slog handler decides.
func (h *hclogAdapter) SetLevel(hclog.Level) {}

func (h *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case h.IsDebug():
		return hclog.Debug
	case h.IsWarn():
		return hclog.Warn
	}
	return hclog.Error
}

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{h}
}

// stdWriter turns "[LEVEL] text" lines from a standard logger into records.
type stdWriter struct{ h *hclogAdapter }

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\r\n")
	l := hclog.Info
	for tag, lv := range map[string]hclog.Level{"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug, "[INFO]": hclog.Info, "[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error} {
		if i := strings.Index(line, tag); i >= 0 {
			l, line = lv, strings.TrimSpace(line[i+len(tag):])
			break
		}
	}
	w.h.Log(l, line)
	return len(p), nil
}
