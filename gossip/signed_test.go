package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/identity"
)

// lyingIdentity is a hostile node's identity: a certificate (valid or
// not for the cluster) that it claims proves claim when it checks itself.
// Other nodes check its chain with their own CA.
type lyingIdentity struct {
	*identity.Bundle
	claim string
}

func (l lyingIdentity) Verifier(chain [][]byte) (string, func(msg, sig []byte) bool, time.Time, error) {
	_, verify, notAfter, err := l.Bundle.Verifier(chain)
	return l.claim, verify, notAfter, err
}

// withIdentity gives each node a certificate for its name from ca and
// the shared gossip key.
func withIdentity(t *testing.T, ca *testCA, mod func(*Config)) func(*Config) {
	return func(c *Config) {
		c.SecretKey = testKey
		c.Identity = ca.bundle(t, c.NodeName)
		if mod != nil {
			mod(c)
		}
	}
}

func rejected(c *Mesh, why reject) uint64 { return c.st.rej[why].Load() }

// waitRejected waits until c rejected at least n more of why than before.
func waitRejected(t *testing.T, c *Mesh, why reject, before, n uint64) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool { return rejected(c, why) >= before+n },
		"%s rejects %d %s (has %d)", c.Name(), n, why, rejected(c, why)-before)
}

// sendRaw sends packets to a node's gossip address from a fresh socket,
// as a hostile holder of the gossip key would.
func sendRaw(t *testing.T, to string, pkts ...[]byte) {
	t.Helper()
	conn, err := net.Dial("udp", to)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, p := range pkts {
		if _, err := conn.Write(p); err != nil {
			t.Fatal(err)
		}
	}
}

// forge seals msg under the test key.
func forge(t *testing.T, msg []byte) []byte {
	t.Helper()
	s, err := newSealer(testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.seal(nil, msg)
}

// signedBy signs the version 1 message msg with id, sent at at.
func signedBy(t *testing.T, id Identity, msg []byte, at time.Time) []byte {
	t.Helper()
	s := &signer{id: id, key: chainID(id.Chain()), chain: id.Chain()}
	var scratch []byte
	out, err := s.sign(nil, msg, at, &scratch)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// capture records the load packets a node sends to one address.
type capture struct {
	mu   sync.Mutex
	pkts [][]byte
}

func (c *capture) start(n *testNode, to string) {
	dst := netip.MustParseAddrPort(to)
	f := func(b []byte, ap netip.AddrPort) {
		if ap == dst {
			c.mu.Lock()
			c.pkts = append(c.pkts, bytes.Clone(b))
			c.mu.Unlock()
		}
	}
	n.c.tr.tap.Store(&f)
}

// stop ends the capture and returns the packets carrying figures (not
// chain messages).
func (c *capture) stop(t *testing.T, n *testNode) [][]byte {
	n.c.tr.tap.Store(nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][]byte
	for _, p := range c.pkts {
		msg, err := n.c.seal.open(nil, p)
		if err != nil {
			t.Fatal(err)
		}
		if msg[2] != kindChain {
			out = append(out, p)
		}
	}
	return out
}

func TestSignedFiguresFlowAndViewsAgree(t *testing.T) {
	ca := newTestCA(t)
	reg := prometheus.NewRegistry()
	nodes := startNodes(t, 3, withIdentity(t, ca, func(c *Config) {
		if c.NodeName == "node-a" {
			c.Registry = reg
		}
	}))
	nodes[0].src.set("x", 1)
	nodes[1].src.setFailing("x", 2, true)
	nodes[2].src.set("x", 4)
	nodes[2].c.PublishEngine("x", EngineStats{OK: true, Known: EngineKVUsage | EngineWaiting, KVUsage: 0.25, Waiting: 3})
	for i, nd := range nodes {
		want := int64(7) - nd.src.m["x"]
		waitFor(t, 10*time.Second, func() bool {
			v := nd.c.View()
			e, ok := v.Engine("x")
			return v.RemoteInFlight("x") == want && ok && e.Waiting == 3 && e.KVUsage == 0.25
		}, "node %d sees the others' signed figures", i)
	}
	h := nodes[0].c.View().Health("x")
	if !slices.Equal(h.Failing, []string{"node-b"}) || !slices.Equal(h.Healthy, []string{"node-c"}) {
		t.Fatalf("node-a health of x = %+v", h)
	}
	for _, nd := range nodes {
		if got := nd.c.View().Members(); !slices.Equal(got, []string{"node-a", "node-b", "node-c"}) {
			t.Errorf("%s view members %v", nd.c.Name(), got)
		}
		for _, m := range nd.c.Members() {
			if !m.Proven {
				t.Errorf("%s: member %s not proven", nd.c.Name(), m.Name)
			}
		}
		for r := range numRejects {
			if n := rejected(nd.c, r); n != 0 && r != rejUnknownKey {
				t.Errorf("%s rejected %d %s from well-behaved peers", nd.c.Name(), n, r)
			}
		}
	}
	if got := metricValue(t, reg, "warmroute_gossip_rejected_total", "reason", "bad_signature"); got != 0 {
		t.Errorf("rejected_total{bad_signature} = %v", got)
	}
}

func TestSignedLateJoinerConvergesWithinRefresh(t *testing.T) {
	ca := newTestCA(t)
	quiet := withIdentity(t, ca, func(c *Config) {
		c.PushPullInterval = time.Hour
	})
	nodes := startNodes(t, 3, quiet)
	for i, nd := range nodes {
		nd.src.set("x", int64(1+i))
	}
	waitFor(t, 10*time.Second, func() bool { return nodes[0].c.View().RemoteInFlight("x") == 5 }, "A sees B+C")
	// Let the resend window pass: only refreshes carry the figures now.
	waitResendsDone(t, nodes)
	late := startNode(t, "node-late", nodes, quiet)
	start := time.Now()
	waitFor(t, 10*time.Second, func() bool { return late.c.View().RemoteInFlight("x") == 6 }, "the late joiner converges")
	took := time.Since(start)
	t.Logf("signed late joiner converged %v after New returned (refresh %v)", took, late.c.cfg.RefreshInterval)
	if bound := late.c.cfg.RefreshInterval + time.Second; took > bound {
		t.Errorf("late joiner took %v, more than a refresh interval plus slack (%v)", took, bound)
	}
}

// TestSignedImpostors: a holder of the gossip key without a certificate,
// with a certificate from another CA, or with a valid certificate for
// another name, cannot make its figures or verdicts count, whether it
// speaks under its own name (it joined memberlist) or another member's.
func TestSignedImpostors(t *testing.T) {
	ca := newTestCA(t)
	nodes := startNodes(t, 3, withIdentity(t, ca, nil))
	a, b := nodes[0], nodes[1]
	for _, nd := range nodes {
		nd.src.set("gpu-1/", 1)
	}
	healthy := func() bool {
		v := a.c.View()
		h := v.Health("gpu-1/")
		return v.RemoteInFlight("gpu-1/") == 2 && len(h.Failing) == 0 && slices.Equal(h.Healthy, []string{"node-b", "node-c"}) &&
			slices.Equal(v.Members(), []string{"node-a", "node-b", "node-c"})
	}
	waitFor(t, 10*time.Second, healthy, "A sees B and C")
	check := func(what string) {
		t.Helper()
		if !healthy() {
			v := a.c.View()
			t.Fatalf("%s: A's view changed: remote %d, health %+v, members %v", what, v.RemoteInFlight("gpu-1/"), v.Health("gpu-1/"), v.Members())
		}
	}
	bInstance := b.c.pub.instance
	forged := healthMsg("node-b", bInstance, 1<<40, map[string]int64{"gpu-1/": 1000}, "gpu-1/")

	// No certificate, another member's name: unsigned, and signed with
	// B's key id but no key.
	before := rejected(a.c, rejUnsigned)
	sendRaw(t, a.c.Addr(), forge(t, forged))
	waitRejected(t, a.c, rejUnsigned, before, 1)
	fake := appendSignedHead(nil, forged, b.c.sign.key, uint64(time.Now().UnixMilli()))
	fake = append(fake, bytes.Repeat([]byte{0x30}, 71)...)
	before = rejected(a.c, rejBadSignature)
	sendRaw(t, a.c.Addr(), forge(t, fake))
	waitRejected(t, a.c, rejBadSignature, before, 1)
	check("forged as node-b without a certificate")

	// Hostile members, each joined with the gossip key and loading
	// gpu-1/ heavily and calling it failing.
	ca2 := newTestCA(t)
	hostile := []struct {
		name string
		id   Identity
		why  reject
	}{
		{"mallory-none", nil, rejUnsigned},
		{"mallory-ca2", ca2.bundle(t, "mallory-ca2"), rejBadChain},
		{"mallory-name", lyingIdentity{ca.bundle(t, "node-z"), "mallory-name"}, rejWrongName},
	}
	for _, h := range hostile {
		before := rejected(a.c, h.why)
		m := startNode(t, h.name, nodes, func(c *Config) { c.SecretKey = testKey; c.Identity = h.id })
		m.src.setFailing("gpu-1/", 1000, true)
		m.c.PublishEngine("gpu-1/", EngineStats{OK: true, Known: EngineWaiting, Waiting: 999})
		waitFor(t, 10*time.Second, func() bool { return len(a.c.Members()) == 4 }, "%s joins memberlist", h.name)
		waitRejected(t, a.c, h.why, before, 2)
		check(h.name + " under its own name")
		if _, ok := a.c.View().Engine("gpu-1/"); ok {
			t.Fatalf("%s: A took its engine figures", h.name)
		}
		for _, mb := range a.c.Members() {
			if mb.Name == h.name && mb.Proven {
				t.Fatalf("%s counts as proven", h.name)
			}
		}
		// Its own key signing in another member's name.
		if h.id != nil {
			why := rejWrongName
			if h.why == rejBadChain {
				why = rejUnknownKey // its chain was refused: its key is unknown
			}
			before := rejected(a.c, why)
			sendRaw(t, a.c.Addr(), forge(t, signedBy(t, h.id, forged, time.Now())))
			waitRejected(t, a.c, why, before, 1)
			check(h.name + " as node-b")
		}
		if err := m.c.Close(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, func() bool { return len(a.c.Members()) == 3 }, "%s leaves", h.name)
	}
	check("after all")
}

func TestSignedReplay(t *testing.T) {
	ca := newTestCA(t)
	nodes := startNodes(t, 2, withIdentity(t, ca, nil))
	a, b := nodes[0], nodes[1]
	var cap capture
	cap.start(b, a.c.Addr())
	b.src.setFailing("x", 100, true)
	b.src.set("gone", 7)
	waitFor(t, 10*time.Second, func() bool { return a.c.View().RemoteInFlight("x") == 100 && a.c.View().RemoteInFlight("gone") == 7 }, "A sees x=100")
	old := cap.stop(t, b)
	b.src.setFailing("x", 1, false)
	b.src.remove("gone")
	waitFor(t, 10*time.Second, func() bool {
		v := a.c.View()
		return v.RemoteInFlight("x") == 1 && len(v.Health("x").Failing) == 0
	}, "A sees x=1")
	// "gone" was sent as 0, then dropped; wait until it expires on A.
	waitFor(t, 10*time.Second, func() bool { return !slices.Contains(a.c.View().remoteBackends(), "gone") }, "gone expires on A")
	_, staleBefore := a.c.st.counters()
	sendRaw(t, a.c.Addr(), old...)
	waitFor(t, 10*time.Second, func() bool { _, s := a.c.st.counters(); return s >= staleBefore+uint64(len(old)) },
		"A refuses %d replayed packets as stale", len(old))
	v := a.c.View()
	if v.RemoteInFlight("x") != 1 || len(v.Health("x").Failing) != 0 || slices.Contains(v.remoteBackends(), "gone") {
		t.Fatalf("replay changed A's view: x=%d health %+v backends %v", v.RemoteInFlight("x"), v.Health("x"), v.remoteBackends())
	}
	if n := rejected(a.c, rejBadSignature); n != 0 {
		t.Fatalf("%d replayed packets reached the signature check", n)
	}

	// A genuine packet signed long ago (a capture kept for later) is
	// refused for its age before anything else.
	msg := healthMsg("node-b", b.c.pub.instance, 1<<40, map[string]int64{"x": 500}, "x")
	before := rejected(a.c, rejClockSkew)
	sendRaw(t, a.c.Addr(), forge(t, signedBy(t, b.c.cfg.Identity, msg, time.Now().Add(-2*maxClockSkew))))
	waitRejected(t, a.c, rejClockSkew, before, 1)
	if got := a.c.View().RemoteInFlight("x"); got != 1 {
		t.Fatalf("an old signed packet counted: x=%d", got)
	}
	// The same packet signed now by B's key would count: the check above
	// is what refused it.
	sendRaw(t, a.c.Addr(), forge(t, signedBy(t, b.c.cfg.Identity, msg, time.Now())))
	waitFor(t, 10*time.Second, func() bool { return a.c.View().RemoteInFlight("x") == 500 }, "a fresh packet signed by B counts")
}

// TestRangesDropped: figures out of range are dropped and counted, with
// or without an Identity.
func TestRangesDropped(t *testing.T) {
	ca := newTestCA(t)
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%v", signed), func(t *testing.T) {
			var mod func(*Config)
			if signed {
				mod = withIdentity(t, ca, nil)
			}
			nodes := startNodes(t, 2, mod)
			a, b := nodes[0], nodes[1]
			b.src.set("ok", 3)
			b.src.set("neg", -1)
			b.src.set("huge", MaxInFlight+1)
			b.c.PublishEngine("kv", EngineStats{OK: true, Known: EngineKVUsage, KVUsage: 1.5})
			b.c.PublishEngine("wait", EngineStats{OK: true, Known: EngineWaiting, Waiting: -2})
			b.c.PublishEngine("good", EngineStats{OK: true, Known: EngineKVUsage, KVUsage: 0.5})
			before := rejected(a.c, rejRange)
			waitFor(t, 10*time.Second, func() bool {
				_, ok := a.c.View().Engine("good")
				return a.c.View().RemoteInFlight("ok") == 3 && ok
			}, "A sees the figures in range")
			waitRejected(t, a.c, rejRange, before, 4)
			v := a.c.View()
			if got := v.remoteBackends(); !slices.Equal(got, []string{"ok"}) {
				t.Fatalf("remote backends %v", got)
			}
			for _, id := range []string{"kv", "wait"} {
				if e, ok := v.Engine(id); ok {
					t.Fatalf("engine figures out of range taken for %s: %+v", id, e)
				}
			}
		})
	}
}

func TestStateRanges(t *testing.T) {
	now := time.Now()
	s := selfState("a")
	mustHandle(t, s, publishMsg("a", 1, 1, map[string]int64{"ok": MaxInFlight, "neg": -5, "big": MaxInFlight + 1}), now)
	if got := s.build(nil).remoteBackends(); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("backends %v", got)
	}
	if n := s.rej[rejRange].Load(); n != 2 {
		t.Fatalf("out_of_range = %d, want 2", n)
	}
	// A figure out of range never replaces one in range.
	mustHandle(t, s, publishMsg("a", 1, 2, map[string]int64{"ok": -1}), now)
	wantRemote(t, s, "ok", MaxInFlight, "after an out-of-range figure")
	// Engine figures: NaN, infinities and out-of-range values.
	nan := math.NaN()
	for i, st := range []EngineStats{
		{KVUsage: nan}, {Running: float64(MaxEngineRequests) * 2}, {PrefixHitRate: 1.01}, {Waiting: -1},
		{KVUsage: 1, Running: MaxEngineRequests, Waiting: 0, PrefixHitRate: 0},
	} {
		sec := appendEngine(nil, fmt.Sprintf("e%d", i), st, 0)
		body := appendSection(appendBlockHead(nil, "a", 1, uint64(10+i)), tagEngine, sec)
		mustHandle(t, s, appendBlock(appendHeader(nil, kindPublish), body), now)
	}
	v := s.build(nil)
	for i := range 4 {
		if _, ok := v.Engine(fmt.Sprintf("e%d", i)); ok {
			t.Errorf("engine e%d out of range taken", i)
		}
	}
	if _, ok := v.Engine("e4"); !ok {
		t.Error("engine e4 at the bounds refused")
	}
	// More than MaxBackends backends from one node: the rest refused.
	var sec []byte
	body := appendBlockHead(nil, "a", 1, 100)
	for i := range MaxBackends + 10 {
		if i%1000 == 999 {
			msg := appendBlock(appendHeader(nil, kindPublish), appendSection(body, tagLoads, sec))
			mustHandle(t, s, msg, now)
			sec = sec[:0]
		}
		sec = appendLoad(sec, fmt.Sprintf("b%d", i), 1)
	}
	mustHandle(t, s, appendBlock(appendHeader(nil, kindPublish), appendSection(body, tagLoads, sec)), now)
	if n := len(s.nodes["a"].loads); n != MaxBackends {
		t.Fatalf("node holds %d backends, want %d", n, MaxBackends)
	}
	if n := s.rej[rejTooMany].Load(); n != 11 { // "ok" was held already
		t.Fatalf("too_many_backends = %d, want 11", n)
	}
	checkSums(t, s)
}

// TestSignedStateOrder: the order rules of signed mode make every replay
// of a node's own signed blocks a no-op.
func TestSignedStateOrder(t *testing.T) {
	now := time.Now()
	s := selfState("a")
	s.signed = true
	apply := func(kind byte, instance, seq uint64, at time.Time, loads map[string]int64) {
		t.Helper()
		var msg []byte
		if kind == kindBye {
			msg = byeMsg("a", instance, seq)
		} else {
			msg = publishMsg("a", instance, seq, loads)
		}
		var m wireMsg
		if err := m.decode(msg); err != nil {
			t.Fatal(err)
		}
		s.apply(&m, at)
	}
	x := func() int64 { return remote(s, "x") }
	apply(kindPublish, 5, 10, now, map[string]int64{"x": 1, "y": 1})
	apply(kindPublish, 5, 11, now, map[string]int64{"x": 2})
	// Older seq: stale; the same seq: a second packet of one publish
	// only within the window, and it never refreshes a figure.
	apply(kindPublish, 5, 10, now, map[string]int64{"x": 9})
	apply(kindPublish, 5, 11, now.Add(10*time.Millisecond), map[string]int64{"x": 2, "z": 3})
	if x() != 2 || remote(s, "z") != 3 {
		t.Fatalf("x=%d z=%d", x(), remote(s, "z"))
	}
	at := s.nodes["a"].loads["x"].at
	apply(kindPublish, 5, 11, now.Add(20*time.Millisecond), map[string]int64{"x": 2})
	if got := s.nodes["a"].loads["x"].at; !got.Equal(at) {
		t.Fatal("a duplicate refreshed a figure")
	}
	// y, not refreshed, expires; a replay of the packet that carried it
	// cannot bring it back, nor can the latest packet after the window.
	s.sweep(now.Add(1500 * time.Millisecond))
	apply(kindPublish, 5, 10, now.Add(1600*time.Millisecond), map[string]int64{"x": 1, "y": 1})
	apply(kindPublish, 5, 11, now.Add(1600*time.Millisecond), map[string]int64{"x": 2, "z": 3})
	if remote(s, "y") != 0 || remote(s, "x") != 0 {
		t.Fatalf("replay revived figures: x=%d y=%d", remote(s, "x"), remote(s, "y"))
	}
	// An older run is stale while the current one talks...
	apply(kindPublish, 5, 12, now.Add(1700*time.Millisecond), map[string]int64{"x": 4})
	apply(kindPublish, 4, 99, now.Add(1800*time.Millisecond), map[string]int64{"x": 7})
	if x() != 4 {
		t.Fatalf("older run took over: x=%d", x())
	}
	// ...and followed once the current one has been quiet past expiry
	// (the Mesh only lets messages sent within maxClockSkew get here).
	apply(kindPublish, 4, 100, now.Add(3*time.Second), map[string]int64{"x": 7})
	if x() != 7 {
		t.Fatalf("quiet newer run kept: x=%d", x())
	}
	// The newer run speaks again: it wins at once.
	apply(kindPublish, 5, 13, now.Add(3100*time.Millisecond), map[string]int64{"x": 5})
	if x() != 5 {
		t.Fatalf("x=%d", x())
	}
	// A bye needs a newer seq; then the run is closed.
	apply(kindBye, 5, 13, now.Add(3200*time.Millisecond), nil)
	if x() != 5 {
		t.Fatal("a replayed bye closed the run")
	}
	apply(kindBye, 5, 14, now.Add(3200*time.Millisecond), nil)
	apply(kindPublish, 5, 15, now.Add(3300*time.Millisecond), map[string]int64{"x": 5})
	if x() != 0 {
		t.Fatalf("figures after bye: x=%d", x())
	}
	checkSums(t, s)
}

func TestClockSkew(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	ms := uint64(now.UnixMilli())
	for _, tc := range []struct {
		sent uint64
		ok   bool
	}{
		{ms, true}, {ms - uint64(maxClockSkew.Milliseconds()), true}, {ms + uint64(maxClockSkew.Milliseconds()), true},
		{ms - uint64(maxClockSkew.Milliseconds()) - 1, false}, {ms + uint64(maxClockSkew.Milliseconds()) + 1, false},
		{0, false}, {^uint64(0), false},
	} {
		if _, ok := clockSkew(tc.sent, now); ok != tc.ok {
			t.Errorf("clockSkew(%d) ok = %v, want %v", tc.sent, ok, tc.ok)
		}
	}
}

func TestKeyCache(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	id := ca.bundle(t, "node-a")
	k := newKeyCache(id)
	now := time.Now()
	good := ca.bundle(t, "node-b")
	kid, key, _, ok := k.learn(good.Chain(), now)
	if !ok || key.name != "node-b" || kid != chainID(good.Chain()) {
		t.Fatalf("learn good chain: %v %+v", ok, key)
	}
	if k.lookup(kid, now) != key {
		t.Fatal("lookup after learn")
	}
	sig, err := good.Sign([]byte(sigContext + "m"))
	if err != nil {
		t.Fatal(err)
	}
	var scratch []byte
	if !key.verifySig([]byte("m"), sig, &scratch) || key.verifySig([]byte("n"), sig, &scratch) {
		t.Fatal("verifySig")
	}
	// Another CA: refused, and remembered as refused.
	bad := other.bundle(t, "node-b").Chain()
	if _, _, why, ok := k.learn(bad, now); ok || why != rejBadChain {
		t.Fatalf("chain of another CA: %v %v", ok, why)
	}
	tokens := k.tokens
	if _, _, why, ok := k.learn(bad, now); ok || why != rejBadChain || k.tokens != tokens {
		t.Fatalf("a known bad chain verified again (%v %v, tokens %v -> %v)", ok, why, tokens, k.tokens)
	}
	// Junk: refused.
	if _, _, _, ok := k.learn([][]byte{[]byte("junk")}, now); ok {
		t.Fatal("junk chain accepted")
	}
	// A proof that expires is dropped at its expiry, then verified
	// anew (and refused, expired) when the chain comes again.
	short := ca.bundleFor(t, "node-c", time.Minute)
	sid, _, _, ok := k.learn(short.Chain(), now)
	if !ok {
		t.Fatal("short-lived chain refused")
	}
	later := short.NotAfter.Add(time.Second)
	if k.lookup(sid, later) != nil {
		t.Fatal("expired proof still used")
	}
	if _, _, why, ok := k.learn(short.Chain(), later); ok || why != rejBadChain {
		t.Fatalf("expired chain: %v %v", ok, why)
	}
	// New chains beyond the burst wait for tokens.
	k = newKeyCache(id)
	n := 0
	for i := 0; ; i++ {
		_, _, why, _ := k.learn([][]byte{fmt.Appendf(nil, "junk-%d", i)}, now)
		if why == rejChainRate {
			break
		}
		n++
	}
	if n != chainVerifyBurst {
		t.Fatalf("verified %d new chains at once, want %d", n, chainVerifyBurst)
	}
	if _, _, why, _ := k.learn([][]byte{[]byte("more")}, now.Add(time.Second/chainVerifyRate)); why == rejChainRate {
		t.Fatal("no token after a refill interval")
	}
	// The cache stays bounded.
	k = newKeyCache(id)
	for i := range 3 * maxKeys {
		k.tokens = chainVerifyBurst
		k.learn([][]byte{fmt.Appendf(nil, "junk-%d", i)}, now)
		if len(k.entries) > maxKeys {
			t.Fatalf("%d entries", len(k.entries))
		}
	}
}

func TestChainMessageFitsOnePacket(t *testing.T) {
	s, id := newTestCA(t).signer(t, "router-with-a-long-name-0123456789.example")
	sealer, _ := newSealer(testKey, nil)
	msg := s.chainMsg("router-with-a-long-name-0123456789.example", true)
	pkt := sealer.seal(nil, msg)
	t.Logf("P-256 chain message: %d bytes (certificate %d bytes), sealed %d; signed overhead %d bytes per packet",
		len(msg), len(id.Chain()[0]), len(pkt), s.overhead())
	if len(pkt) > maxPacket {
		t.Fatalf("sealed chain message of %d bytes exceeds %d", len(pkt), maxPacket)
	}
}

func TestNewRefusesAnIdentityForAnotherName(t *testing.T) {
	ca := newTestCA(t)
	cfg := testConfig("node-a")
	cfg.Identity = ca.bundle(t, "node-b")
	if _, err := New(cfg, nil); err == nil || !errors.Is(err, ErrIdentity) {
		t.Fatalf("New with another name's certificate: %v", err)
	}
	cfg.NodeName = "bad name"
	if _, err := New(cfg, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with an invalid name: %v", err)
	}
}

// TestMemberWithBadNameRefused: a memberlist member whose name is not a
// router name never becomes a member.
func TestMemberWithBadNameRefused(t *testing.T) {
	nodes := startNodes(t, 2, nil)
	a := nodes[0]
	before := rejected(a.c, rejMemberName)
	m := startRawMember(t, "evil\x1b[31m name", a.c.Addr())
	defer m.Shutdown()
	waitRejected(t, a.c, rejMemberName, before, 1)
	if n := len(a.c.Members()); n != 2 {
		t.Fatalf("A has %d members", n)
	}
	for _, nd := range nodes {
		if got := nd.c.View().Members(); len(got) != 2 {
			t.Fatalf("%s view members %q", nd.c.Name(), got)
		}
	}
}

// TestHeavyHealthSection: pairing many health marks with many loads
// stays linear.
func TestHeavyHealthSection(t *testing.T) {
	var loads, health []byte
	for i := range MaxBackends {
		id := fmt.Sprintf("b%d", i)
		loads = appendLoad(loads, id, 1)
		health = appendHealth(health, id, healthFailing)
	}
	body := appendSection(appendSection(appendBlockHead(nil, "a", 1, 1), tagLoads, loads), tagHealth, health)
	msg := appendBlock(appendHeader(nil, kindPublish), body)
	var m wireMsg
	start := time.Now()
	if err := m.decode(msg); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for _, l := range m.blocks[0].loads {
		if !l.failing {
			t.Fatalf("%s not failing", l.backend)
		}
	}
	if took > 500*time.Millisecond {
		t.Fatalf("decoding %d loads with health marks took %v", MaxBackends, took)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no metric %s{%s=%q}", name, label, value)
	return 0
}

// startRawMember joins a bare memberlist node (no load packets) named
// name to seed.
func startRawMember(t *testing.T, name, seed string) *memberlist.Memberlist {
	t.Helper()
	mc := memberlist.DefaultLANConfig()
	mc.Name = name
	mc.BindAddr = "127.0.0.1"
	mc.BindPort = 0
	mc.LogOutput = io.Discard
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = ml.Join([]string{seed})
	return ml
}
