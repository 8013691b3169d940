package gossip

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"
)

// TestHotSection: a publish carries the hot prefixes once, the receiver
// keeps the last section per node for maxAge, and forgets them when the
// sender restarts.
func TestHotSection(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var list []HotPrefix
	for i := 0; i < MaxHotEntries+10; i++ {
		list = append(list, HotPrefix{Key: uint64(i) * 0x9e3779b97f4a7c15, Depth: uint32(i % MaxHotDepth)})
	}
	list[3].Depth = MaxHotDepth // out of range: not sent
	p := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	p.setHot(list)
	st := selfState("node-a")
	for _, pkt := range p.next(now) {
		mustHandle(t, st, pkt, now)
	}
	got := st.hotPrefixes(nil, time.Second, now)
	want := slices.Delete(slices.Clone(list), 3, 4)[:MaxHotEntries]
	if !slices.Equal(got, want) {
		t.Fatalf("received %d prefixes %v..., want the first %d in range", len(got), got[:min(3, len(got))], MaxHotEntries)
	}
	// Sent once: the next tick carries no section, and the prefixes stay.
	for _, pkt := range p.next(now.Add(50 * time.Millisecond)) {
		var m wireMsg
		if err := m.decode(pkt); err != nil || m.blocks[0].hasHot {
			t.Fatalf("second tick: %v, hot section %v", err, m.blocks[0].hasHot)
		}
		mustHandle(t, st, pkt, now.Add(50*time.Millisecond))
	}
	if len(st.hotPrefixes(nil, time.Second, now.Add(time.Second))) != MaxHotEntries {
		t.Fatal("prefixes dropped by a publish without a section")
	}
	// dst's keys are not repeated.
	if got := st.hotPrefixes([]HotPrefix{list[0]}, time.Second, now); len(got) != MaxHotEntries || got[0] != list[0] {
		t.Fatalf("with dst holding one of them: %d prefixes", len(got))
	}
	if len(st.hotPrefixes(nil, time.Second, now.Add(1100*time.Millisecond))) != 0 {
		t.Fatal("prefixes older than maxAge kept")
	}
	// A new section replaces the last.
	p.setHot(list[:2])
	for _, pkt := range p.next(now.Add(100 * time.Millisecond)) {
		mustHandle(t, st, pkt, now.Add(100*time.Millisecond))
	}
	if got := st.hotPrefixes(nil, time.Second, now.Add(100*time.Millisecond)); !slices.Equal(got, list[:2]) {
		t.Fatalf("after a second section: %v", got)
	}
	// A new run of the sender drops them.
	q := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	q.instance = p.instance + 1
	for _, pkt := range q.next(now) {
		mustHandle(t, st, pkt, now.Add(100*time.Millisecond))
	}
	if got := st.hotPrefixes(nil, time.Second, now.Add(100*time.Millisecond)); len(got) != 0 {
		t.Fatalf("prefixes of the sender's previous run kept: %v", got)
	}
}

// TestHotSectionBounds: sections that break the bounds are refused whole.
func TestHotSectionBounds(t *testing.T) {
	mk := func(payloads ...[]byte) []byte {
		blk := appendBlockHead(nil, "n", 1, 1)
		for _, p := range payloads {
			blk = appendSection(blk, tagHot, p)
		}
		return appendBlock(appendHeader(nil, kindPublish), blk)
	}
	entry := func(key uint64, depth uint64) []byte {
		return binary.AppendUvarint(binary.LittleEndian.AppendUint64(nil, key), depth)
	}
	ok := appendHot(nil, []HotPrefix{{Key: 7, Depth: 0}, {Key: 1 << 63, Depth: MaxHotDepth - 1}})
	var m wireMsg
	if err := m.decode(mk(ok)); err != nil || !m.blocks[0].hasHot || len(m.blocks[0].hot) != 2 || m.blocks[0].hot[1].Key != 1<<63 {
		t.Fatalf("valid section: %v %+v", err, m.blocks)
	}
	var tooMany []byte
	for i := 0; i <= MaxHotEntries; i++ {
		tooMany = append(tooMany, entry(uint64(i), 1)...)
	}
	for name, msg := range map[string][]byte{
		"depth out of range": mk(entry(1, MaxHotDepth)),
		"huge depth":         mk(entry(1, 1<<40)),
		"too many entries":   mk(tooMany),
		"truncated key":      mk([]byte{1, 2, 3}),
		"missing depth":      mk(binary.LittleEndian.AppendUint64(nil, 5)),
		"two sections":       mk(ok, ok),
	} {
		if err := m.decode(msg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestHotPrefixesAcrossNodes: over loopback, signed and unsigned, each
// node's published hot prefixes reach the others.
func TestHotPrefixesAcrossNodes(t *testing.T) {
	ca := newTestCA(t)
	for name, mod := range map[string]func(*Config){"unsigned": nil, "signed": withIdentity(t, ca, nil)} {
		t.Run(name, func(t *testing.T) {
			nodes := startNodes(t, 3, mod)
			for i, n := range nodes[1:] {
				n.c.PublishHot([]HotPrefix{{Key: uint64(100 + i), Depth: uint32(i)}, {Key: 42, Depth: 3}})
			}
			var got []HotPrefix
			waitFor(t, 5*time.Second, func() bool {
				got = nodes[0].c.HotPrefixes(got[:0], 2*time.Second)
				return len(got) == 3
			}, "node-a to hear both others' hot prefixes")
			slices.SortFunc(got, func(a, b HotPrefix) int { return int(a.Key) - int(b.Key) })
			if want := []HotPrefix{{42, 3}, {100, 0}, {101, 1}}; !slices.Equal(got, want) {
				t.Fatalf("node-a has %v, want %v", got, want)
			}
		})
	}
}
