package cluster

import (
	"bufio"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// Raft's RPC types on the wire (unexported in raft's net_transport.go;
// TestRPCGateTypes checks them against raft's own transport).
const (
	rpcAppendEntries uint8 = iota
	rpcRequestVote
	rpcInstallSnapshot
	rpcTimeoutNow
	rpcRequestPreVote
)

// maxRPCBytes bounds one RPC's request (not a snapshot's data, which
// follows it): an AppendEntries batch of Raft's 64 entries, each a
// command of at most a few megabytes, fits many times over.
const maxRPCBytes = 256 << 20

// errRPCRefused: an RPC on an authenticated connection that does not
// speak for the router the connection proved.
var errRPCRefused = errors.New("cluster: raft RPC refused")

// rpcClaims is what an RPC says about its sender.
type rpcClaims struct {
	kind uint8
	// id and addr are the RPCHeader's; leader is AppendEntries' and
	// InstallSnapshot's Leader, or RequestVote's Candidate (addresses
	// older Raft versions read instead of addr).
	id, addr, leader []byte
}

// rpcGate stands between an inbound Raft connection whose TLS handshake
// proved a router name and Raft's transport, which believes every RPC's
// header (who sends it, at which address, who leads). It decodes each
// RPC exactly as the transport will, from bytes it records, hands them
// to check, and only then gives the transport those same bytes. A
// refused RPC ends the connection: Read returns io.EOF (a clean end for
// the transport; check reports and counts the refusal).
//
// The transport handles a connection's RPCs one after another, reading
// the next only after it answered the last, so the gate decodes in Read,
// on the transport's goroutine, with no buffering beyond one RPC.
type rpcGate struct {
	rec   recorder
	dec   *codec.Decoder
	check func(rpcClaims) error

	out      []byte // checked bytes the transport has not read yet
	off      int
	snapshot int64 // InstallSnapshot data still to pass through
	err      error // sticky: the connection is over
}

func newRPCGate(src io.Reader, check func(rpcClaims) error) *rpcGate {
	g := &rpcGate{rec: recorder{src: bufio.NewReader(src)}, check: check}
	g.dec = codec.NewDecoder(&g.rec, &codec.MsgpackHandle{}) // as the transport's
	return g
}

func (g *rpcGate) Read(p []byte) (int, error) {
	if g.off == len(g.out) {
		if g.snapshot > 0 {
			n, err := g.rec.src.Read(p[:min(int64(len(p)), g.snapshot)])
			g.snapshot -= int64(n)
			return n, err
		}
		if g.err != nil {
			return 0, g.err
		}
		if err := g.next(); err != nil {
			g.err = err
			if errors.Is(err, errRPCRefused) {
				return 0, io.EOF
			}
			return 0, err
		}
	}
	n := copy(p, g.out[g.off:])
	g.off += n
	return n, nil
}

// next reads, decodes and checks the next RPC.
func (g *rpcGate) next() error {
	typ, err := g.rec.src.ReadByte()
	if err != nil {
		return err
	}
	g.rec.start(typ)
	var (
		c    = rpcClaims{kind: typ}
		size int64
	)
	switch typ {
	case rpcAppendEntries:
		var req raft.AppendEntriesRequest
		err = g.dec.Decode(&req)
		c.id, c.addr, c.leader = req.ID, req.Addr, req.Leader
	case rpcRequestVote:
		var req raft.RequestVoteRequest
		err = g.dec.Decode(&req)
		c.id, c.addr, c.leader = req.ID, req.Addr, req.Candidate
	case rpcRequestPreVote:
		var req raft.RequestPreVoteRequest
		err = g.dec.Decode(&req)
		c.id, c.addr = req.ID, req.Addr
	case rpcInstallSnapshot:
		var req raft.InstallSnapshotRequest
		err = g.dec.Decode(&req)
		c.id, c.addr, c.leader, size = req.ID, req.Addr, req.Leader, req.Size
		if err == nil && size < 0 {
			err = fmt.Errorf("snapshot of %d bytes", size)
		}
	case rpcTimeoutNow:
		var req raft.TimeoutNowRequest
		err = g.dec.Decode(&req)
		c.id, c.addr = req.ID, req.Addr
	default:
		err = fmt.Errorf("unknown RPC type %d", typ)
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return err // the connection ended mid-RPC
		}
		// Claims that name nobody: check counts it as malformed.
		return g.check(rpcClaims{kind: typ})
	}
	if err := g.check(c); err != nil {
		return err
	}
	g.out, g.off, g.snapshot = g.rec.buf, 0, size
	return nil
}

// recorder reads for the decoder and keeps what it read: one RPC's
// bytes, the type byte first.
type recorder struct {
	src *bufio.Reader
	buf []byte
	err error // set once the RPC outgrew maxRPCBytes
}

func (r *recorder) start(typ byte) {
	if cap(r.buf) > 1<<20 {
		r.buf = nil // do not keep a large RPC's buffer for the next ones
	}
	r.buf = append(r.buf[:0], typ)
	r.err = nil
}

func (r *recorder) grow(n int) error {
	if len(r.buf)+n > maxRPCBytes {
		r.err = fmt.Errorf("%w: a request over %d bytes", errRPCRefused, maxRPCBytes)
	}
	return r.err
}

func (r *recorder) Read(p []byte) (int, error) {
	if err := r.grow(len(p)); err != nil {
		return 0, err
	}
	n, err := r.src.Read(p)
	r.buf = append(r.buf, p[:n]...)
	return n, err
}

func (r *recorder) ReadByte() (byte, error) {
	if err := r.grow(1); err != nil {
		return 0, err
	}
	b, err := r.src.ReadByte()
	if err == nil {
		r.buf = append(r.buf, b)
	}
	return b, err
}

func (r *recorder) UnreadByte() error {
	if err := r.src.UnreadByte(); err != nil {
		return err
	}
	r.buf = r.buf[:len(r.buf)-1]
	return nil
}

// rpcCheck returns the check of every RPC on an inbound connection whose
// certificate (leaf) proved router name: the RPC must name that router
// (header ID), give an address that is not known as another router's
// (header Addr, and the Leader or Candidate field), come from a router
// whose certificate is not revoked since the handshake, and, when it
// leads (AppendEntries, InstallSnapshot, TimeoutNow), from a member of
// the Raft configuration (or, while this node's configuration lags, a
// router it proved and gossip shows alive). A refusal is counted by
// reason and logged, at most once a minute per router and reason.
func (c *Agreement) rpcCheck(name string, leaf *x509.Certificate) func(rpcClaims) error {
	return func(r rpcClaims) error {
		reason, detail := c.rpcVerdict(name, leaf, r)
		if reason == "" {
			return nil
		}
		c.met.rpcRefused.WithLabelValues(reason).Inc()
		if c.rpcWarn.due(name+"|"+reason, time.Now()) {
			c.log.Warn("raft: refusing an RPC that does not speak for the router that sent it; its connection is closed",
				"router", name, "rpc", rpcName(r.kind), "reason", reason, "detail", detail)
		}
		return fmt.Errorf("%w: %s: %s", errRPCRefused, reason, detail)
	}
}

// rpcVerdict returns why an RPC is refused ("" when it is not) and a
// detail for the log.
func (c *Agreement) rpcVerdict(name string, leaf *x509.Certificate, r rpcClaims) (reason, detail string) {
	if r.id == nil && r.addr == nil && r.leader == nil {
		return "malformed", "the request does not decode"
	}
	if id := c.cfg.Identity; id != nil {
		if err := id.Revocations().Check(leaf, name); err != nil {
			return "revoked", err.Error()
		}
	}
	if string(r.id) != name {
		return "rpc_id", fmt.Sprintf("the RPC claims to come from %q", r.id)
	}
	for _, a := range [][]byte{r.addr, r.leader} {
		if len(a) == 0 {
			continue
		}
		if at := c.expectedAt(string(a)); len(at) > 0 && !at[name] {
			return "rpc_addr", fmt.Sprintf("the RPC gives address %s, which is %s's", a, joinNames(at))
		}
	}
	switch r.kind {
	case rpcAppendEntries, rpcInstallSnapshot, rpcTimeoutNow:
		if !c.mayLead(name) {
			return "not_member", "a router outside the Raft configuration cannot lead"
		}
	}
	return "", ""
}

// mayLead reports whether router name may send this node what only a
// leader sends: it is in the latest Raft configuration, or this node's
// configuration may lag (a router added while this one was cut off) and
// name proved itself to this node's probes and is alive in gossip.
func (c *Agreement) mayLead(name string) bool {
	if r := c.raftPtr.Load(); r != nil {
		for _, s := range r.GetConfiguration().Configuration().Servers {
			if string(s.ID) == name {
				return true
			}
		}
	}
	if v := c.view.Load(); v != nil {
		if s, ok := v.get(name); !ok || !s.alive() {
			return false
		}
	}
	return c.verified.okAnywhere(name, time.Now())
}

func joinNames(set map[string]bool) string {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, " and ")
}

func rpcName(kind uint8) string {
	switch kind {
	case rpcAppendEntries:
		return "AppendEntries"
	case rpcRequestVote:
		return "RequestVote"
	case rpcInstallSnapshot:
		return "InstallSnapshot"
	case rpcTimeoutNow:
		return "TimeoutNow"
	case rpcRequestPreVote:
		return "RequestPreVote"
	}
	return fmt.Sprintf("type %d", kind)
}

// warnLimiter lets one log line per key through every interval.
type warnLimiter struct {
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
}

// due reports whether key may be logged now, and records it.
func (w *warnLimiter) due(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[string]time.Time{}
	}
	if t, ok := w.last[key]; ok && now.Sub(t) < w.interval {
		return false
	}
	if len(w.last) >= 1024 { // names come from certificates of the cluster CA; still bounded
		clear(w.last)
	}
	w.last[key] = now
	return true
}
