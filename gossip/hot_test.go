package gossip

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"
)

// hotOf returns what st holds of node's counted hot prefixes.
func hotOf(st *state, node string, maxAge time.Duration, now time.Time) (HotReport, bool) {
	for _, r := range st.hotReports(nil, maxAge, maxAge, now) {
		if r.Node == node {
			return r, true
		}
	}
	return HotReport{}, false
}

// TestHotSection: a publish carries the hot prefixes once, with their
// counts, the sender's total and its partition count; the receiver keeps
// the last section per node for maxAge, and forgets it when the sender
// restarts. The uncounted section earlier leaders read goes beside it.
func TestHotSection(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var list []HotPrefix
	for i := 0; i < MaxHotEntries+10; i++ {
		list = append(list, HotPrefix{Key: uint64(i) * 0x9e3779b97f4a7c15, Depth: uint32(i % MaxHotDepth), Count: uint64(100 + i), Part: uint32(i)})
	}
	list[3].Depth = MaxHotDepth // out of range: not sent
	list[5].Part = 271          // not a partition of a ring of 271: not sent
	p := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	p.setHot(5000, 271, list)
	st := selfState("node-a")
	var sawOld bool
	for _, pkt := range p.next(now) {
		var m wireMsg
		if err := m.decode(pkt); err == nil && m.blocks[0].hasHot {
			sawOld = len(m.blocks[0].hot) == MaxHotEntries
		}
		mustHandle(t, st, pkt, now)
	}
	if !sawOld {
		t.Fatal("no uncounted section of MaxHotEntries prefixes beside the counted one")
	}
	got, ok := hotOf(st, "node-a", time.Second, now)
	want := slices.Delete(slices.Delete(slices.Clone(list), 5, 6), 3, 4)[:MaxHotCounted]
	if !ok || got.Total != 5000 || got.Partitions != 271 || !slices.Equal(got.Prefixes, want) {
		t.Fatalf("received %+v..., want the first %d in range, total 5000 of 271 partitions", got.Prefixes[:min(3, len(got.Prefixes))], MaxHotCounted)
	}
	// Sent once: the next tick carries no section, and the prefixes stay.
	for _, pkt := range p.next(now.Add(50 * time.Millisecond)) {
		var m wireMsg
		if err := m.decode(pkt); err != nil || m.blocks[0].hasHot || m.blocks[0].hasHotC {
			t.Fatalf("second tick: %v, sections %v %v", err, m.blocks[0].hasHot, m.blocks[0].hasHotC)
		}
		mustHandle(t, st, pkt, now.Add(50*time.Millisecond))
	}
	if got, _ := hotOf(st, "node-a", time.Second, now.Add(time.Second)); len(got.Prefixes) != MaxHotCounted {
		t.Fatal("prefixes dropped by a publish without a section")
	}
	if _, ok := hotOf(st, "node-a", time.Second, now.Add(1100*time.Millisecond)); ok {
		t.Fatal("prefixes older than maxAge kept")
	}
	// A new section replaces the last.
	p.setHot(300, 271, list[:2])
	for _, pkt := range p.next(now.Add(100 * time.Millisecond)) {
		mustHandle(t, st, pkt, now.Add(100*time.Millisecond))
	}
	if got, _ := hotOf(st, "node-a", time.Second, now.Add(100*time.Millisecond)); !slices.Equal(got.Prefixes, list[:2]) || got.Total != 300 {
		t.Fatalf("after a second section: %+v", got)
	}
	// A new run of the sender drops them.
	q := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	q.instance = p.instance + 1
	for _, pkt := range q.next(now) {
		mustHandle(t, st, pkt, now.Add(100*time.Millisecond))
	}
	if got, ok := hotOf(st, "node-a", time.Second, now.Add(100*time.Millisecond)); ok {
		t.Fatalf("prefixes of the sender's previous run kept: %+v", got)
	}
}

// TestHotSectionBounds: sections that break the bounds are refused whole.
func TestHotSectionBounds(t *testing.T) {
	mk := func(tag byte, payloads ...[]byte) []byte {
		blk := appendBlockHead(nil, "n", 1, 1)
		for _, p := range payloads {
			blk = appendSection(blk, tag, p)
		}
		return appendBlock(appendHeader(nil, kindPublish), blk)
	}
	entry := func(key uint64, depth uint64) []byte {
		return binary.AppendUvarint(binary.LittleEndian.AppendUint64(nil, key), depth)
	}
	ok := appendHot(nil, []HotPrefix{{Key: 7, Depth: 0}, {Key: 1 << 63, Depth: MaxHotDepth - 1}})
	var m wireMsg
	if err := m.decode(mk(tagHot, ok)); err != nil || !m.blocks[0].hasHot || len(m.blocks[0].hot) != 2 || m.blocks[0].hot[1].Key != 1<<63 {
		t.Fatalf("valid section: %v %+v", err, m.blocks)
	}
	var tooMany []byte
	for i := 0; i <= MaxHotEntries; i++ {
		tooMany = append(tooMany, entry(uint64(i), 1)...)
	}
	for name, msg := range map[string][]byte{
		"depth out of range": mk(tagHot, entry(1, MaxHotDepth)),
		"huge depth":         mk(tagHot, entry(1, 1<<40)),
		"too many entries":   mk(tagHot, tooMany),
		"truncated key":      mk(tagHot, []byte{1, 2, 3}),
		"missing depth":      mk(tagHot, binary.LittleEndian.AppendUint64(nil, 5)),
		"two sections":       mk(tagHot, ok, ok),
	} {
		if err := m.decode(msg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}

	head := func(total, parts uint64) []byte {
		return binary.AppendUvarint(binary.AppendUvarint(nil, total), parts)
	}
	counted := func(key, depth, count, part uint64) []byte {
		b := binary.LittleEndian.AppendUint64(nil, key)
		b = binary.AppendUvarint(b, depth)
		b = binary.AppendUvarint(b, count)
		return binary.AppendUvarint(b, part)
	}
	okC := appendHotCounts(nil, 900, 271, []HotPrefix{{Key: 7, Depth: 0, Count: 900, Part: 270}, {Key: 1 << 63, Depth: MaxHotDepth - 1, Count: 1, Part: 0}})
	if err := m.decode(mk(tagHotCounts, okC)); err != nil || !m.blocks[0].hasHotC || len(m.blocks[0].hotCounts) != 2 ||
		m.blocks[0].hotTotal != 900 || m.blocks[0].hotParts != 271 || m.blocks[0].hotCounts[0] != (HotPrefix{Key: 7, Count: 900, Part: 270}) {
		t.Fatalf("valid counted section: %v %+v", err, m.blocks)
	}
	tooMany = head(100, 10)
	for i := 0; i <= MaxHotCounted; i++ {
		tooMany = append(tooMany, counted(uint64(i), 1, 1, 1)...)
	}
	for name, msg := range map[string][]byte{
		"counted: depth out of range":     mk(tagHotCounts, append(head(100, 10), counted(1, MaxHotDepth, 1, 1)...)),
		"counted: count over total":       mk(tagHotCounts, append(head(100, 10), counted(1, 0, 101, 1)...)),
		"counted: partition out of range": mk(tagHotCounts, append(head(100, 10), counted(1, 0, 1, 10)...)),
		"counted: no partitions":          mk(tagHotCounts, head(100, 0)),
		"counted: too many partitions":    mk(tagHotCounts, head(100, MaxPartitions+1)),
		"counted: huge total":             mk(tagHotCounts, head(MaxHotTotal+1, 10)),
		"counted: too many entries":       mk(tagHotCounts, tooMany),
		"counted: truncated":              mk(tagHotCounts, append(head(100, 10), 1, 2, 3)),
		"counted: two sections":           mk(tagHotCounts, okC, okC),
	} {
		if err := m.decode(msg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestHotPrefixesAcrossNodes: over loopback, signed and unsigned, each
// node's published hot prefixes reach the others with their counts and
// the partition counts the same node published.
func TestHotPrefixesAcrossNodes(t *testing.T) {
	ca := newTestCA(t)
	for name, mod := range map[string]func(*Config){"unsigned": nil, "signed": withIdentity(t, ca, nil)} {
		t.Run(name, func(t *testing.T) {
			nodes := startNodes(t, 3, mod)
			for i, n := range nodes[1:] {
				loads := make([]uint32, 8)
				loads[i+2] = 64
				n.c.PublishPartitions(loads, 1)
				n.c.PublishHot(1000, 8, []HotPrefix{{Key: uint64(100 + i), Depth: uint32(i), Count: 500, Part: uint32(i + 2)}, {Key: 42, Depth: 3, Count: 200, Part: 1}})
			}
			var got []HotReport
			waitFor(t, 5*time.Second, func() bool {
				got = nodes[0].c.HotReports(got[:0], 2*time.Second, 2*time.Second)
				return len(got) == 2 && got[0].Parts != nil && got[1].Parts != nil
			}, "node-a to hear both others' hot prefixes and partition counts")
			slices.SortFunc(got, func(a, b HotReport) int { return int(a.Prefixes[0].Key) - int(b.Prefixes[0].Key) })
			for i, r := range got {
				want := []HotPrefix{{Key: uint64(100 + i), Depth: uint32(i), Count: 500, Part: uint32(i + 2)}, {Key: 42, Depth: 3, Count: 200, Part: 1}}
				if r.Total != 1000 || r.Partitions != 8 || !slices.Equal(r.Prefixes, want) || !slices.Equal(r.Parts, []PartLoad{{Partition: uint32(i + 2), Count: 64}}) {
					t.Fatalf("node-a has %+v from %s, want %+v", r, r.Node, want)
				}
			}
		})
	}
}
