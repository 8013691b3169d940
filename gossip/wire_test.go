package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func testPublisher(t *testing.T, src LocalSource) *publisher {
	t.Helper()
	cfg := DefaultConfig()
	return newPublisher("node-a", 42, src, &cfg)
}

func TestWireRoundTrip(t *testing.T) {
	src := staticSource{{"b1", 3, false}, {"b2", 0, true}, {"b3", -1, false}, {"gpu-x/", 1 << 40, true}}
	p := testPublisher(t, src)
	now := time.Now()
	p.setEngine("b1", EngineStats{KVUsage: 0.5, Running: 3, Waiting: 2, PrefixHitRate: 0.25,
		Known: EngineKVUsage | EngineRunning | EngineWaiting | EnginePrefixHitRate, OK: true, Scraped: now.Add(-1500 * time.Millisecond)})
	p.setEngine("b2", EngineStats{Known: EngineRunning, Running: 7, Scraped: now})
	pkts := p.next(now)
	if len(pkts) != 1 {
		t.Fatalf("got %d packets, want 1", len(pkts))
	}
	var m wireMsg
	if err := m.decode(pkts[0]); err != nil {
		t.Fatal(err)
	}
	if m.kind != kindPublish || len(m.blocks) != 1 {
		t.Fatalf("kind %d, %d blocks", m.kind, len(m.blocks))
	}
	blk := m.blocks[0]
	if string(blk.origin) != "node-a" || blk.instance != 42 || blk.seq != 1 {
		t.Fatalf("head = %q %d %d", blk.origin, blk.instance, blk.seq)
	}
	got := map[string]BackendLoad{}
	for _, l := range blk.loads {
		if l.seq != 1 || l.age != 0 || l.relay {
			t.Errorf("load %s: seq %d age %v relay %v", l.backend, l.seq, l.age, l.relay)
		}
		got[string(l.backend)] = BackendLoad{Backend: string(l.backend), InFlight: l.inFlight, Failing: l.failing}
	}
	for _, want := range src {
		if v, ok := got[want.Backend]; !ok || v != want {
			t.Errorf("backend %s = %+v,%v, want %+v", want.Backend, v, ok, want)
		}
	}
	if len(blk.engines) != 2 {
		t.Fatalf("%d engines, want 2", len(blk.engines))
	}
	for _, e := range blk.engines {
		switch string(e.backend) {
		case "b1":
			s := e.stats
			if !s.OK || s.KVUsage != 0.5 || s.Running != 3 || s.Waiting != 2 || s.PrefixHitRate != 0.25 || s.Known != 15 {
				t.Errorf("b1 stats %+v", s)
			}
			if e.age != 1500*time.Millisecond {
				t.Errorf("b1 age %v", e.age)
			}
		case "b2":
			if e.stats.OK || e.stats.Running != 7 || e.stats.Known != EngineRunning {
				t.Errorf("b2 stats %+v", e.stats)
			}
		default:
			t.Errorf("unexpected engine %q", e.backend)
		}
	}
}

func TestWirePacketsStayUnderLimit(t *testing.T) {
	var src staticSource
	for i := range 500 {
		src = append(src, BackendLoad{Backend: fmt.Sprintf("http://10.1.%d.%d:8000/", i/250, i%250), InFlight: int64(i), Failing: i%7 == 0})
	}
	p := testPublisher(t, src)
	now := time.Now()
	for i := range 200 {
		p.setEngine(fmt.Sprintf("e%d", i), EngineStats{OK: true, Known: EngineWaiting, Waiting: float64(i), Scraped: now})
	}
	pkts := p.next(now)
	if len(pkts) < 2 {
		t.Fatalf("expected several packets, got %d", len(pkts))
	}
	loads, engines := map[string]bool{}, 0
	failing := map[string]bool{}
	for _, bl := range src {
		failing[bl.Backend] = bl.Failing
	}
	var m wireMsg
	for _, pkt := range pkts {
		if len(pkt) > maxPacket {
			t.Errorf("packet of %d bytes exceeds %d", len(pkt), maxPacket)
		}
		if err := m.decode(pkt); err != nil {
			t.Fatal(err)
		}
		for _, l := range m.blocks[0].loads {
			if loads[string(l.backend)] {
				t.Errorf("backend %s sent twice", l.backend)
			}
			loads[string(l.backend)] = true
			// A load and its health entry travel in the same packet.
			if l.failing != failing[string(l.backend)] {
				t.Errorf("backend %s failing = %v, want %v", l.backend, l.failing, failing[string(l.backend)])
			}
		}
		engines += len(m.blocks[0].engines)
	}
	if len(loads) != len(src) || engines != 200 {
		t.Fatalf("decoded %d loads and %d engines, want %d and 200", len(loads), engines, len(src))
	}
}

func TestWireSkipsUnknownSection(t *testing.T) {
	body := appendBlockHead(nil, "n", 1, 2)
	body = appendSection(body, 99, []byte("future per-backend fields"))
	body = appendSection(body, tagLoads, appendLoad(nil, "b", 5))
	msg := appendBlock(appendHeader(nil, kindPublish), body)
	var m wireMsg
	if err := m.decode(msg); err != nil {
		t.Fatal(err)
	}
	if len(m.blocks[0].loads) != 1 || m.blocks[0].loads[0].inFlight != 5 {
		t.Fatalf("loads = %+v", m.blocks[0].loads)
	}
}

func TestWireRejects(t *testing.T) {
	good := appendBlock(appendHeader(nil, kindPublish), appendSection(appendBlockHead(nil, "n", 1, 1), tagLoads, appendLoad(nil, "b", 1)))
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"empty":       {nil, ErrBadMessage},
		"magic":       {append([]byte{0}, good[1:]...), ErrBadMessage},
		"version":     {append([]byte{wireMagic, 9}, good[2:]...), ErrUnknownVersion},
		"kind":        {append([]byte{wireMagic, wireVersion, 77}, good[3:]...), ErrBadMessage},
		"truncated":   {good[:len(good)-1], ErrBadMessage},
		"trailing":    {append(good[:len(good):len(good)], 0x05), ErrBadMessage},
		"no origin":   {appendBlock(appendHeader(nil, kindPublish), appendBlockHead(nil, "", 1, 1)), ErrBadMessage},
		"two blocks":  {appendBlock(good, appendBlockHead(nil, "m", 1, 1)), ErrBadMessage},
		"long string": {appendBlock(appendHeader(nil, kindPublish), appendBlockHead(nil, string(make([]byte, maxString+1)), 1, 1)), ErrBadMessage},
	}
	for name, tc := range cases {
		var m wireMsg
		if err := m.decode(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	var m wireMsg
	if err := m.decode(good); err != nil {
		t.Fatalf("good message: %v", err)
	}
}

// FuzzDecode feeds arbitrary bytes to the receive path: decoding must never
// panic, and whatever is applied must keep the per-backend sums equal to
// the figures held per node.
func FuzzDecode(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	p := testPublisher(&testing.T{}, staticSource{{Backend: "b1", InFlight: 3}, {Backend: "b2", InFlight: 9, Failing: true}})
	p.setEngine("b1", EngineStats{OK: true, Known: EngineWaiting, Waiting: 2, Scraped: now})
	for _, pkt := range p.next(now) {
		f.Add(append([]byte(nil), pkt...))
	}
	f.Add(p.bye())
	st := newState("x", time.Minute, time.Minute)
	st.join("node-a")
	st.handle(p.next(now)[0], now)
	f.Add(st.appendRelay(appendHeader(nil, kindState), now))
	f.Add(append(appendHeader(nil, kindState), p.ownBlock(nil, now, nil)...))
	f.Add([]byte{wireMagic, wireV1, kindPublish, 0})
	// Version 2 (signed), which a node without an Identity takes unverified.
	f.Add(append(appendSignedHead(nil, p.next(now.Add(time.Second))[0], keyID{1}, 5), 0x30, 0x01, 0x02))
	pp := testPublisher(&testing.T{}, staticSource{{Backend: "b1", InFlight: 1}})
	pp.setParts([]uint32{0, 7, 300, 0, 1 << 20}, 1)
	f.Add(append([]byte(nil), pp.next(now)[0]...))
	pp.setHot(90, 5, []HotPrefix{{Key: 1 << 40, Depth: 2, Count: 40, Part: 4}, {Key: 3, Depth: MaxHotDepth - 1, Count: 90}})
	for _, pkt := range pp.next(now.Add(time.Second)) {
		f.Add(append([]byte(nil), pkt...))
	}
	pp.setCost(CostFigure{Unit: 1500, Requests: 40, FromAnswers: true})
	for _, pkt := range pp.next(now.Add(2 * time.Second)) {
		f.Add(append([]byte(nil), pkt...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := newState("self", time.Minute, time.Minute)
		s.join("node-a")
		s.join("n")
		if _, err := s.handle(b, now); err != nil {
			return
		}
		s.handle(b, now.Add(time.Second))
		checkSums(t, s)
		checkHealth(t, s)
		for _, n := range []int{1, 5, 1 << 10} {
			s.addParts(make([]uint64, n), time.Hour, now) // in range, or it panics
		}
		for _, r := range s.hotReports(nil, time.Hour, time.Hour, now) {
			for _, h := range r.Prefixes {
				if h.Depth >= MaxHotDepth || h.Count > r.Total || uint64(h.Part) >= r.Partitions || len(r.Prefixes) > MaxHotCounted {
					t.Fatalf("hot prefix out of range kept: %+v of %+v", h, r)
				}
			}
		}
		for _, r := range s.costReports(nil, time.Hour, now) {
			if r.Unit > MaxCostUnit || r.Requests > MaxCostRequests {
				t.Fatalf("cost figure out of range kept: %+v", r)
			}
		}
		s.sweep(now.Add(2 * time.Minute))
		checkSums(t, s)
		checkHealth(t, s)
		if len(s.sums) != 0 {
			t.Fatalf("sums left after expiry: %v", s.sums)
		}
	})
}

func TestWireSigned(t *testing.T) {
	s, id := newTestCA(t).signer(t, "n")
	at := time.UnixMilli(1_700_000_000_123)
	v1 := publishMsg("n", 3, 4, map[string]int64{"b": 2})
	var scratch []byte
	msg, err := s.sign(nil, v1, at, &scratch)
	if err != nil {
		t.Fatal(err)
	}
	var m wireMsg
	if err := m.decode(msg); err != nil {
		t.Fatal(err)
	}
	if m.version != wireV2 || m.kind != kindPublish || m.key != s.key || m.sentAt != uint64(at.UnixMilli()) ||
		len(m.blocks) != 1 || string(m.blocks[0].origin) != "n" || m.blocks[0].loads[0].inFlight != 2 {
		t.Fatalf("decoded %+v", m)
	}
	if !bytes.Equal(m.signed, msg[:len(msg)-len(m.sig)]) || len(m.sig) == 0 || len(m.sig) > s.sigMax {
		t.Fatalf("signed part %d bytes, signature %d", len(m.signed), len(m.sig))
	}
	_, verify, _, _ := id.Verifier(id.Chain())
	if !(&peerKey{verify: verify}).verifySig(m.signed, m.sig, &scratch) {
		t.Fatal("signature does not verify")
	}

	sign := func(v1 []byte) []byte {
		out, err := s.sign(nil, v1, at, &scratch)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	relay := appendBlock(appendHeader(nil, kindState),
		appendSection(appendBlockHead(nil, "n", 1, 1), tagLoadsRelay, appendLoadRelay(nil, "b", 1, 1, 0)))
	chainIn := func(kind byte) []byte {
		return appendBlock(appendHeader(nil, kind), appendSection(appendBlockHead(nil, "n", 1, 1), tagChain, appendChain(nil, id.Chain())))
	}
	head := appendSignedHead(nil, v1, s.key, 1)
	cases := map[string][]byte{
		"relay in a signed state":   sign(relay),
		"chain in a signed publish": sign(chainIn(kindPublish)),
		"chain in an unsigned msg":  chainIn(kindState),
		"no signature":              head,
		"signature too long":        append(bytes.Clone(head), make([]byte, maxSig+1)...),
		"short key":                 []byte{wireMagic, wireV2, kindPublish, 1, 2},
		"chain msg, trailing":       append(appendChainMsg(nil, "n", id.Chain(), false), 0),
		"chain msg, no certs":       appendChainMsg(nil, "n", nil, false),
		"chain msg, no origin":      appendChainMsg(nil, "", id.Chain(), false),
		"chain msg, long origin":    appendChainMsg(nil, strings.Repeat("n", maxNodeName+1), id.Chain(), false),
		"chain msg, 9 certs":        appendChainMsg(nil, "n", slices.Repeat(id.Chain(), 9), false),
		"unsigned chain kind":       append([]byte{wireMagic, wireV1, kindChain}, appendChainMsg(nil, "n", id.Chain(), false)[3:]...),
	}
	for name, b := range cases {
		var m wireMsg
		if err := m.decode(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if err := m.decode(sign(chainIn(kindState))); err != nil || len(m.blocks[0].chain) != 1 {
		t.Fatalf("chain in a signed state: %v", err)
	}
	if err := m.decode(appendChainMsg(nil, "n", id.Chain(), true)); err != nil || !m.want || string(m.origin) != "n" || len(m.chain) != 1 {
		t.Fatalf("chain message: %v", err)
	}
}
