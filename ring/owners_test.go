package ring

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

type libMember string

func (m libMember) String() string { return string(m) }

type libHasher func([]byte) uint64

func (h libHasher) Sum64(b []byte) uint64 { return h(b) }

// libraryOwners is the reference: buraksezer/consistent v0.10.0's own
// bounded-load placement of the same members (IDs sorted, named
// memberName(ID)), as owner IDs per partition. ok is false when the
// library panics.
func libraryOwners(cfg Config, bs []Backend) (owners []string, ok bool) {
	defer func() {
		if recover() != nil {
			owners, ok = nil, false
		}
	}()
	sorted := slices.SortedFunc(slices.Values(bs), func(a, b Backend) int { return cmp.Compare(a.ID, b.ID) })
	members := make([]consistent.Member, len(sorted))
	for i, b := range sorted {
		members[i] = libMember(memberName(b.ID))
	}
	parts := cfg.partitions(len(bs))
	c := consistent.New(members, consistent.Config{
		Hasher:            libHasher(cfg.Hash),
		PartitionCount:    parts,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.PartitionLoad,
	})
	owners = make([]string, parts)
	for p := range owners {
		name := c.GetPartitionOwner(p).String()
		owners[p] = name[:len(name)-1]
	}
	return owners, true
}

// TestOwnersMatchLibrary checks that New places every partition exactly
// where buraksezer/consistent places it, across backend counts, replication
// factors, partition counts, load bounds, and a weak hash that makes
// virtual nodes and partitions collide; and that New fails exactly when the
// library panics.
func TestOwnersMatchLibrary(t *testing.T) {
	weak := func(b []byte) uint64 { return xxhash.Sum64(b) & 0x3ff } // 1,024 values
	tiny := func(b []byte) uint64 { return xxhash.Sum64(b) % 37 }
	hashes := map[string]func([]byte) uint64{"xxhash": xxhash.Sum64, "weak": weak, "tiny": tiny}
	rng := rand.New(rand.NewPCG(3, 4))
	mismatches, failures, cases := 0, 0, 0
	for _, n := range []int{1, 2, 3, 5, 7, 12, 31, 64, 150} {
		for _, rf := range []int{1, 2, 3, 20} {
			for _, parts := range []int{0, 13, 271, 1009} {
				for _, load := range []float64{1.01, 1.25, 2} {
					for hname, h := range hashes {
						if parts != 0 && parts < n {
							continue
						}
						if n >= 64 && (rf < 20 || load != 1.25) {
							continue // keep the reference's O(n^2 log n) cost bounded
						}
						cfg := DefaultConfig()
						cfg.ReplicationFactor, cfg.PartitionCount, cfg.PartitionLoad, cfg.Hash = rf, parts, load, h
						bs := gpus(n)
						// Mixed names, some ending in digits, some not.
						for i := range bs {
							if rng.IntN(3) == 0 {
								bs[i].ID = fmt.Sprintf("node-%x.zone", rng.Uint32())
							}
						}
						rng.Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
						name := fmt.Sprintf("n=%d/rf=%d/parts=%d/load=%g/%s", n, rf, parts, load, hname)
						cases++
						want, ok := libraryOwners(cfg, bs)
						got, err := circleOwnerIDs(cfg, bs)
						switch {
						case !ok && err == nil:
							t.Errorf("%s: library panics, New succeeded", name)
							continue
						case ok && err != nil:
							t.Errorf("%s: New failed (%v), library placed", name, err)
							continue
						case !ok:
							failures++
							continue
						}
						if r, err := New(cfg, bs); err != nil {
							t.Errorf("%s: New failed where both placements succeed: %v", name, err)
						} else if lib := ownersByID(r); !slices.Equal(lib, want) {
							t.Errorf("%s: New's owners differ from the library's", name)
						}
						for p := range want {
							if got[p] != want[p] {
								mismatches++
								t.Errorf("%s: partition %d owned by %s, library says %s", name, p, got[p], want[p])
								break
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d cases, %d where both refuse the layout", cases, failures)
	if failures == 0 || failures == cases {
		t.Errorf("want both placed and refused layouts among the cases, got %d refused of %d", failures, cases)
	}
}

// circleOwnerIDs runs circleOwners as New would for bs (sorted by ID) and
// returns owner IDs per partition.
func circleOwnerIDs(cfg Config, bs []Backend) ([]string, error) {
	sorted := slices.SortedFunc(slices.Values(bs), func(a, b Backend) int { return cmp.Compare(a.ID, b.ID) })
	parts := cfg.partitions(len(sorted))
	c := newCircle(virtualNodes(cfg, sorted), cfg.ReplicationFactor)
	owners, err := circleOwners(cfg, len(sorted), c, c.starts(cfg, parts))
	if err != nil {
		return nil, err
	}
	out := make([]string, len(owners))
	for p, o := range owners {
		out[p] = sorted[o].ID
	}
	return out, nil
}

// TestOwnersMatchLibraryLarge compares one 1,000-backend default ring.
func TestOwnersMatchLibraryLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("the reference takes about a second")
	}
	bs := gpus(1000)
	// ReplicationFactor 20 keeps the library's O(n^2 log n) New to about a
	// second; the default's circle is compared at smaller sizes above.
	cfg := DefaultConfig()
	cfg.ReplicationFactor = 20
	want, ok := libraryOwners(cfg, bs)
	if !ok {
		t.Fatal("library refused the layout")
	}
	got := ownersByID(mustRing(t, cfg, bs))
	for p := range want {
		if got[p] != want[p] {
			t.Fatalf("partition %d owned by %s, library says %s", p, got[p], want[p])
		}
	}
}
