package gossip

import (
	"slices"
	"testing"
	"time"
)

// TestPartsSection: a publish carries the busiest partitions once, the
// receiver adds them up per partition for a ring of the same size only,
// and forgets them after maxAge or when the sender restarts.
func TestPartsSection(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	loads := make([]uint32, 300)
	for i := range loads {
		loads[i] = uint32(i % 7) // many small counts
	}
	loads[10], loads[250] = 5000, 4000
	p := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	p.setParts(loads, 3)
	st := selfState("node-a")
	for _, pkt := range p.next(now) {
		mustHandle(t, st, pkt, now)
	}
	got := make([]uint64, 300)
	if n := st.addParts(got, time.Second, now); n != 1 {
		t.Fatalf("added %d nodes' counts, want 1", n)
	}
	if got[10] != 5000 || got[250] != 4000 {
		t.Fatalf("busiest partitions: %d, %d", got[10], got[250])
	}
	entries := 0
	for i, c := range got {
		if c == 0 {
			continue
		}
		entries++
		if c < 3 || uint32(c) != loads[i] {
			t.Fatalf("partition %d: %d, sent %d (min 3)", i, c, loads[i])
		}
	}
	if entries != MaxPartEntries {
		t.Fatalf("%d partitions sent, want the busiest %d", entries, MaxPartEntries)
	}
	// Sent once: the next tick carries no section, and the figures stay.
	for _, pkt := range p.next(now.Add(50 * time.Millisecond)) {
		var m wireMsg
		if err := m.decode(pkt); err != nil || m.blocks[0].parts != 0 {
			t.Fatalf("second tick: %v, parts %d", err, m.blocks[0].parts)
		}
		mustHandle(t, st, pkt, now.Add(50*time.Millisecond))
	}
	if st.addParts(make([]uint64, 300), time.Second, now.Add(time.Second)) != 1 {
		t.Fatal("counts dropped by a publish without a section")
	}
	// Another ring size, or too old: not added.
	if st.addParts(make([]uint64, 299), time.Second, now) != 0 {
		t.Fatal("counts of a 300-partition ring added to a 299-partition one")
	}
	if st.addParts(make([]uint64, 300), time.Second, now.Add(1100*time.Millisecond)) != 0 {
		t.Fatal("counts older than maxAge added")
	}
	// A new run of the sender drops them.
	q := testPublisher(t, staticSource{{Backend: "b1", InFlight: 1}})
	q.instance = p.instance + 1
	for _, pkt := range q.next(now) {
		mustHandle(t, st, pkt, now)
	}
	if st.addParts(make([]uint64, 300), time.Second, now) != 0 {
		t.Fatal("counts of the sender's previous run kept")
	}
}

// TestPartsSectionBounds: sections that break the bounds are refused whole.
func TestPartsSectionBounds(t *testing.T) {
	mk := func(payload []byte) []byte {
		blk := appendBlockHead(nil, "n", 1, 1)
		blk = appendSection(blk, tagParts, payload)
		return appendBlock(appendHeader(nil, kindPublish), blk)
	}
	var ok []byte
	ok, _ = appendParts(ok, []uint32{1, 2, 3}, 0, nil)
	var m wireMsg
	if err := m.decode(mk(ok)); err != nil || m.blocks[0].parts != 3 || len(m.blocks[0].partLoad) != 3 {
		t.Fatalf("valid section: %v %+v", err, m.blocks)
	}
	many := make([]uint32, MaxPartEntries+1)
	for i := range many {
		many[i] = 1
	}
	tooMany := []byte{byte(len(many))}
	for i := range many {
		tooMany = append(tooMany, byte(i), 1)
	}
	for name, payload := range map[string][]byte{
		"no partitions":       {0},
		"partition past end":  {2, 2, 1},
		"too many entries":    tooMany,
		"partitions too many": {0x81, 0x80, 0x80, 0x01}, // 2^21 + 1
		"truncated entry":     {4, 1},
	} {
		if err := m.decode(mk(payload)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// appendParts sends the busiest, busiest first.
	_, top := appendParts(nil, []uint32{5, 0, 9, 1, 7}, 2, nil)
	want := []PartLoad{{2, 9}, {4, 7}, {0, 5}}
	if !slices.Equal(top, want) {
		t.Fatalf("top %v, want %v", top, want)
	}
}

// TestPartitionLoadsAcrossNodes: over loopback, signed and unsigned, each
// node's published partition counts reach the others.
func TestPartitionLoadsAcrossNodes(t *testing.T) {
	ca := newTestCA(t)
	for name, mod := range map[string]func(*Config){"unsigned": nil, "signed": withIdentity(t, ca, nil)} {
		t.Run(name, func(t *testing.T) {
			nodes := startNodes(t, 3, mod)
			for i, n := range nodes {
				loads := make([]uint32, 64)
				loads[i] = uint32(100 * (i + 1))
				loads[63] = 1
				n.c.PublishPartitions(loads, 0)
			}
			got := make([]uint64, 64)
			waitFor(t, 5*time.Second, func() bool {
				clear(got)
				return nodes[0].c.PartitionLoads(got, 2*time.Second) == 2
			}, "node-a to hear both others' partition counts")
			if got[0] != 0 || got[1] != 200 || got[2] != 300 || got[63] != 2 {
				t.Fatalf("node-a adds up %v", got[:4])
			}
		})
	}
}
