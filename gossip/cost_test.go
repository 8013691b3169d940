package gossip

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"
)

// costOf returns what st holds of node's cost figure.
func costOf(st *state, node string, maxAge time.Duration, now time.Time) (CostReport, bool) {
	for _, r := range st.costReports(nil, maxAge, now) {
		if r.Node == node {
			return r, true
		}
	}
	return CostReport{}, false
}

// TestCostSection: a publish carries the cost figure once; the receiver
// keeps the last one per node for maxAge, a new one replaces it, and a
// new run of the sender drops it.
func TestCostSection(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	p.setCost(CostFigure{Unit: 1500, Requests: 40, FromAnswers: true})
	st := selfState("node-a")
	for _, pkt := range p.next(now) {
		mustHandle(t, st, pkt, now)
	}
	want := CostFigure{Unit: 1500, Requests: 40, FromAnswers: true}
	if got, ok := costOf(st, "node-a", time.Second, now); !ok || got.CostFigure != want {
		t.Fatalf("received %+v (%v), want %+v", got, ok, want)
	}
	// Sent once: the next tick has no section, and the figure stays.
	for _, pkt := range p.next(now.Add(50 * time.Millisecond)) {
		var m wireMsg
		if err := m.decode(pkt); err != nil || m.blocks[0].hasCost {
			t.Fatalf("second tick: %v, cost section %v", err, m.blocks[0].hasCost)
		}
		mustHandle(t, st, pkt, now.Add(50*time.Millisecond))
	}
	if _, ok := costOf(st, "node-a", time.Second, now.Add(time.Second)); !ok {
		t.Fatal("figure dropped by a publish without a section")
	}
	if _, ok := costOf(st, "node-a", time.Second, now.Add(1100*time.Millisecond)); ok {
		t.Fatal("figure older than maxAge kept")
	}
	// Out-of-range figures are clamped by the sender.
	p.setCost(CostFigure{Unit: 1 << 50, Requests: 1 << 62})
	for _, pkt := range p.next(now.Add(100 * time.Millisecond)) {
		mustHandle(t, st, pkt, now.Add(100*time.Millisecond))
	}
	want = CostFigure{Unit: MaxCostUnit, Requests: MaxCostRequests}
	if got, _ := costOf(st, "node-a", time.Second, now.Add(100*time.Millisecond)); got.CostFigure != want {
		t.Fatalf("after a second section: %+v, want %+v", got, want)
	}
	q := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	q.instance = p.instance + 1
	for _, pkt := range q.next(now) {
		mustHandle(t, st, pkt, now.Add(100*time.Millisecond))
	}
	if got, ok := costOf(st, "node-a", time.Second, now.Add(100*time.Millisecond)); ok {
		t.Fatalf("figure of the sender's previous run kept: %+v", got)
	}
}

// TestCostSectionBounds: a section out of its bounds, truncated, with
// bytes past its end, or twice in a block is refused.
func TestCostSectionBounds(t *testing.T) {
	mk := func(payloads ...[]byte) []byte {
		blk := appendBlockHead(nil, "n", 1, 1)
		for _, p := range payloads {
			blk = appendSection(blk, tagCost, p)
		}
		return appendBlock(appendHeader(nil, kindPublish), blk)
	}
	raw := func(unit, requests uint64, flags byte) []byte {
		return append(binary.AppendUvarint(binary.AppendUvarint(nil, unit), requests), flags)
	}
	var m wireMsg
	if err := m.decode(mk(raw(MaxCostUnit, MaxCostRequests, costFromAnswers))); err != nil || !m.blocks[0].hasCost ||
		m.blocks[0].cost != (CostFigure{Unit: MaxCostUnit, Requests: MaxCostRequests, FromAnswers: true}) {
		t.Fatalf("valid section: %v %+v", err, m.blocks)
	}
	for name, msg := range map[string][]byte{
		"unit out of range":     mk(raw(MaxCostUnit+1, 1, 0)),
		"requests out of range": mk(raw(1, MaxCostRequests+1, 0)),
		"truncated":             mk(binary.AppendUvarint(nil, 5)),
		"trailing bytes":        mk(append(raw(1, 1, 0), 9)),
		"two sections":          mk(raw(1, 1, 0), raw(2, 2, 0)),
	} {
		if err := m.decode(msg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCostAcrossNodes: over loopback, signed and unsigned, each node's
// published cost figure reaches the others.
func TestCostAcrossNodes(t *testing.T) {
	ca := newTestCA(t)
	for name, mod := range map[string]func(*Config){"unsigned": nil, "signed": withIdentity(t, ca, nil)} {
		t.Run(name, func(t *testing.T) {
			nodes := startNodes(t, 3, mod)
			for i, n := range nodes[1:] {
				n.c.PublishCost(CostFigure{Unit: uint64(1000 + i), Requests: 10, FromAnswers: i == 0})
			}
			var got []CostReport
			waitFor(t, 5*time.Second, func() bool {
				got = nodes[0].c.CostReports(got[:0], 2*time.Second)
				return len(got) == 2
			}, "node-a to hear both others' cost figures")
			slices.SortFunc(got, func(a, b CostReport) int { return strings.Compare(a.Node, b.Node) })
			for i, r := range got {
				want := CostFigure{Unit: uint64(1000 + i), Requests: 10, FromAnswers: i == 0}
				if r.CostFigure != want || r.Node == nodes[0].c.cfg.NodeName {
					t.Fatalf("node-a has %+v from %s, want %+v", r.CostFigure, r.Node, want)
				}
			}
		})
	}
}
