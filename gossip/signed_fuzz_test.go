package gossip

import (
	"bytes"
	"log/slog"
	"slices"
	"testing"
	"time"
)

// FuzzDecodeChainMsg feeds arbitrary bytes to the chain message parser:
// it must never panic, must hold what it accepts to the bounds, and what
// it accepts encodes and decodes back to itself.
func FuzzDecodeChainMsg(f *testing.F) {
	ca := newTestCA(f)
	id := ca.bundle(f, "node-a")
	f.Add(appendChainMsg(nil, "node-a", id.Chain(), true))
	f.Add(appendChainMsg(nil, "node-a", [][]byte{[]byte("x"), []byte("yz")}, false))
	f.Add([]byte{wireMagic, wireV2, kindChain, 0, 1, 'a', 0})
	f.Add([]byte{wireMagic, wireV2, kindChain, 1, 1, 'a', 9, 1, 'c'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m wireMsg
		if err := m.decode(b); err != nil || m.kind != kindChain {
			return
		}
		if len(m.origin) == 0 || len(m.origin) > maxNodeName || len(m.chain) == 0 || len(m.chain) > maxChainCerts {
			t.Fatalf("accepted origin of %d bytes, chain of %d", len(m.origin), len(m.chain))
		}
		for _, c := range m.chain {
			if len(c) == 0 || len(c) > maxCertLen {
				t.Fatalf("accepted a certificate of %d bytes", len(c))
			}
		}
		again := appendChainMsg(nil, string(m.origin), m.chain, m.want)
		var m2 wireMsg
		if err := m2.decode(again); err != nil || !bytes.Equal(m2.origin, m.origin) || m2.want != m.want ||
			!slices.EqualFunc(m2.chain, m.chain, bytes.Equal) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// FuzzReceiveSigned feeds arbitrary messages to the receive path of a node
// with an Identity: the signed envelope, its signature, the chain section
// of a state, and chain messages. It must never panic; the sums and health
// lists must match the figures held; and only figures a member signed can
// be held: mutations that keep a valid signature are the seeds' own.
func FuzzReceiveSigned(f *testing.F) {
	ca := newTestCA(f)
	selfSigner, self := ca.signer(f, "self")
	peerSigner, peer := ca.signer(f, "node-a")
	now := time.Now()
	signed := func(msg []byte) []byte {
		var scratch []byte
		out, err := peerSigner.sign(nil, msg, now, &scratch)
		if err != nil {
			f.Fatal(err)
		}
		return out
	}
	// The figures node-a signs; nothing else may ever be held.
	want := map[string]int64{"x": 3, "y": 5}
	cfg := DefaultConfig()
	pub := newPublisher("node-a", 7, staticSource{{Backend: "x", InFlight: 3}, {Backend: "y", InFlight: 5, Failing: true}}, &cfg)
	for _, p := range pub.next(now) {
		f.Add(signed(p))
	}
	f.Add(signed(append(appendHeader(nil, kindState), pub.ownBlock(nil, now, peer.Chain())...)))
	f.Add(signed(pub.bye()))
	f.Add(appendChainMsg(nil, "node-a", peer.Chain(), true))
	f.Add(publishMsg("node-a", 7, 99, map[string]int64{"x": 1000}))

	f.Fuzz(func(t *testing.T, b []byte) {
		st := newState("self", time.Minute, time.Minute)
		st.signed = true
		st.join("node-a")
		st.join("n")
		c := &Mesh{
			cfg: Config{NodeName: "self"}, log: slog.New(slog.DiscardHandler),
			st: st, sign: selfSigner, keys: newKeyCache(self), chain: chainState{reqs: make(chan chainReq, 256)},
		}
		rx := new(rxScratch)
		// Twice: the second time the chain may be known.
		for range 2 {
			if err := rx.msg.decode(b); err != nil {
				return
			}
			c.receiveSigned(&rx.msg, now, &rx.sig)
		}
		checkSums(t, st)
		checkHealth(t, st)
		st.mu.Lock()
		defer st.mu.Unlock()
		for name, n := range st.nodes {
			for k, e := range n.loads {
				if name != "node-a" || want[k] != e.v {
					t.Fatalf("holds %s=%d from %s, which no member signed", k, e.v, name)
				}
			}
		}
	})
}
