package cluster

import (
	"bytes"
	"errors"
	"io"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// pipeStream is a Raft stream layer over loopback TCP whose accepted
// connections read through wrap (the gate under test).
type pipeStream struct {
	ln   net.Listener
	wrap func(net.Conn) net.Conn
}

func (s *pipeStream) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.wrap(c), nil
}
func (s *pipeStream) Close() error   { return s.ln.Close() }
func (s *pipeStream) Addr() net.Addr { return s.ln.Addr() }
func (s *pipeStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

// gatedConn reads through an rpcGate.
type gatedConn struct {
	net.Conn
	g *rpcGate
}

func (c gatedConn) Read(p []byte) (int, error) { return c.g.Read(p) }

// serve answers every RPC recv delivers with handle until the test ends.
func serve(t *testing.T, recv *raft.NetworkTransport, handle func(raft.RPC)) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case rpc := <-recv.Consumer():
				handle(rpc)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// gatedPair is a sending transport and a receiving one whose inbound
// connections pass an rpcGate with check.
func gatedPair(t *testing.T, check func(rpcClaims) error) (send, recv *raft.NetworkTransport) {
	t.Helper()
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	recv = raft.NewNetworkTransport(&pipeStream{ln: listen(), wrap: func(c net.Conn) net.Conn {
		return gatedConn{Conn: c, g: newRPCGate(c, check)}
	}}, 2, 5*time.Second, io.Discard)
	send = raft.NewNetworkTransport(&pipeStream{ln: listen(), wrap: func(c net.Conn) net.Conn { return c }}, 2, 5*time.Second, io.Discard)
	t.Cleanup(func() { send.Close(); recv.Close() })
	return send, recv
}

// TestRPCGateTypes: every kind of RPC Raft's transport sends (a batch of
// entries, a megabyte entry, a heartbeat, votes, a snapshot with its
// data, TimeoutNow) passes the gate byte for byte: the receiving
// transport decodes exactly what was sent, and the gate saw each RPC's
// kind and header as sent (its RPC type numbers are Raft's).
func TestRPCGateTypes(t *testing.T) {
	var mu sync.Mutex
	var seen []rpcClaims
	send, recv := gatedPair(t, func(c rpcClaims) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, c)
		return nil
	})
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("r1"), Addr: []byte("10.0.0.1:7001")}
	big := bytes.Repeat([]byte("x"), 1<<20)
	snapData := bytes.Repeat([]byte("snapshot"), 20000)
	type sent struct {
		kind uint8
		req  any
	}
	reqs := []sent{
		{rpcAppendEntries, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 3, Leader: hdr.Addr, PrevLogEntry: 7, PrevLogTerm: 2,
			Entries:           []*raft.Log{{Index: 8, Term: 3, Type: raft.LogCommand, Data: []byte(`{"op":"x"}`)}, {Index: 9, Term: 3, Type: raft.LogCommand, Data: big}},
			LeaderCommitIndex: 7}},
		{rpcAppendEntries, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 3, Leader: hdr.Addr}}, // a heartbeat
		{rpcRequestVote, &raft.RequestVoteRequest{RPCHeader: hdr, Term: 4, Candidate: hdr.Addr, LastLogIndex: 9, LastLogTerm: 3}},
		{rpcRequestPreVote, &raft.RequestPreVoteRequest{RPCHeader: hdr, Term: 5, LastLogIndex: 9, LastLogTerm: 3}},
		{rpcInstallSnapshot, &raft.InstallSnapshotRequest{RPCHeader: hdr, SnapshotVersion: 1, Term: 5, Leader: hdr.Addr, LastLogIndex: 9,
			LastLogTerm: 3, Size: int64(len(snapData)), Configuration: []byte("cfg"), ConfigurationIndex: 2}},
		{rpcTimeoutNow, &raft.TimeoutNowRequest{RPCHeader: hdr}},
		{rpcAppendEntries, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 5, Leader: hdr.Addr, PrevLogEntry: 9, PrevLogTerm: 3, LeaderCommitIndex: 9}},
	}
	got := make(chan any, len(reqs))
	snapGot := make(chan []byte, 1)
	serve(t, recv, func(rpc raft.RPC) {
		if rpc.Reader != nil {
			b, _ := io.ReadAll(rpc.Reader)
			snapGot <- b
		}
		got <- rpc.Command
		var resp any
		switch rpc.Command.(type) {
		case *raft.AppendEntriesRequest:
			resp = &raft.AppendEntriesResponse{Success: true}
		case *raft.RequestVoteRequest:
			resp = &raft.RequestVoteResponse{Granted: true}
		case *raft.RequestPreVoteRequest:
			resp = &raft.RequestPreVoteResponse{Granted: true}
		case *raft.InstallSnapshotRequest:
			resp = &raft.InstallSnapshotResponse{Success: true}
		case *raft.TimeoutNowRequest:
			resp = &raft.TimeoutNowResponse{}
		}
		rpc.Respond(resp, nil)
	})
	target := recv.LocalAddr()
	for _, r := range reqs {
		var err error
		switch req := r.req.(type) {
		case *raft.AppendEntriesRequest:
			err = send.AppendEntries("recv", target, req, &raft.AppendEntriesResponse{})
		case *raft.RequestVoteRequest:
			err = send.RequestVote("recv", target, req, &raft.RequestVoteResponse{})
		case *raft.RequestPreVoteRequest:
			err = send.RequestPreVote("recv", target, req, &raft.RequestPreVoteResponse{})
		case *raft.InstallSnapshotRequest:
			err = send.InstallSnapshot("recv", target, req, &raft.InstallSnapshotResponse{}, bytes.NewReader(snapData))
		case *raft.TimeoutNowRequest:
			err = send.TimeoutNow("recv", target, req, &raft.TimeoutNowResponse{})
		}
		if err != nil {
			t.Fatalf("%T: %v", r.req, err)
		}
		select {
		case cmd := <-got:
			if !reflect.DeepEqual(normLogs(cmd), normLogs(r.req)) {
				t.Fatalf("sent %+v\nreceived %+v", r.req, cmd)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%T never arrived", r.req)
		}
	}
	if b := <-snapGot; !bytes.Equal(b, snapData) {
		t.Fatalf("snapshot data: %d bytes, want %d", len(b), len(snapData))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(reqs) {
		t.Fatalf("the gate saw %d RPCs, want %d", len(seen), len(reqs))
	}
	for i, c := range seen {
		if c.kind != reqs[i].kind || string(c.id) != "r1" || string(c.addr) != string(hdr.Addr) {
			t.Errorf("RPC %d (%T): the gate saw kind %d id %q addr %q", i, reqs[i].req, c.kind, c.id, c.addr)
		}
	}
}

// normLogs clears what the transport's time encoding may not keep
// (AppendedAt) from an AppendEntriesRequest's entries.
func normLogs(v any) any {
	a, ok := v.(*raft.AppendEntriesRequest)
	if !ok {
		return v
	}
	c := *a
	c.Entries = nil
	for _, l := range a.Entries {
		l2 := *l
		l2.AppendedAt = time.Time{}
		c.Entries = append(c.Entries, &l2)
	}
	return &c
}

// TestRPCGateRefuses: a refused RPC never reaches Raft, and its
// connection ends.
func TestRPCGateRefuses(t *testing.T) {
	send, recv := gatedPair(t, func(c rpcClaims) error {
		if string(c.id) != "r1" {
			return errRPCRefused
		}
		return nil
	})
	delivered := make(chan struct{}, 4)
	serve(t, recv, func(rpc raft.RPC) {
		delivered <- struct{}{}
		rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
	})
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("r0"), Addr: []byte("x:1")},
		Term: 9, PrevLogEntry: 1, Entries: []*raft.Log{{Index: 2, Term: 9, Type: raft.LogCommand, Data: []byte("{}")}}}
	err := send.AppendEntries("recv", recv.LocalAddr(), req, &raft.AppendEntriesResponse{})
	if err == nil || !errors.Is(err, io.EOF) && !isConnErr(err) {
		t.Fatalf("a refused AppendEntries: %v, want the connection closed", err)
	}
	req.ID = []byte("r1")
	if err := send.AppendEntries("recv", recv.LocalAddr(), req, &raft.AppendEntriesResponse{}); err != nil {
		t.Fatalf("an accepted AppendEntries on a new connection: %v", err)
	}
	if n := len(delivered); n != 1 {
		t.Fatalf("%d RPCs reached Raft, want 1 (the accepted one)", n)
	}
}

func isConnErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}
