package ring

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/placement.golden from the current build")

// goldenCase is one membership and config whose placement is pinned.
type goldenCase struct {
	name string
	cfg  Config
	bs   []Backend
}

// goldenCases are the memberships and configs whose partition tables
// testdata/placement.golden pins: fleet sizes on both sides of the size
// where the library stops computing owners, names ending in digits (whose
// virtual-node names would collide without memberName's '/'), weights,
// zones and states (none of which may move a partition), replication
// factors, partition counts, load bounds, overflow depths, and weak hashes
// that make virtual nodes and partitions collide or refuse the layout.
func goldenCases() []goldenCase {
	rng := rand.New(rand.NewPCG(17, 17))
	mixed := func(n int) []Backend {
		bs := gpus(n)
		zones := []string{"us-east-1a", "us-east-1b", "us-east-1c"}
		for i := range bs {
			switch rng.IntN(4) {
			case 0:
				bs[i].ID = fmt.Sprintf("node-%x.zone", rng.Uint32())
			case 1:
				bs[i].ID = fmt.Sprintf("10.%d.%d.%d:8000", rng.IntN(256), rng.IntN(256), rng.IntN(256))
			}
			bs[i].Zone = zones[rng.IntN(len(zones))]
			bs[i].Weight = rng.IntN(4)
			bs[i].State = State(rng.IntN(3))
		}
		rng.Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
		return bs
	}
	weak := func(b []byte) uint64 { return xxhash.Sum64(b) & 0x3ff }
	tiny := func(b []byte) uint64 { return xxhash.Sum64(b) % 37 }
	var cases []goldenCase
	add := func(name string, cfg Config, bs []Backend) {
		cases = append(cases, goldenCase{name: name, cfg: cfg, bs: bs})
	}
	for _, n := range []int{1, 2, 7, 10, 12, 20, 21, 64, 100, 250, 1000, 1500} {
		add(fmt.Sprintf("gpus=%d/default", n), DefaultConfig(), gpus(n))
		add(fmt.Sprintf("mixed=%d/default", n), DefaultConfig(), mixed(n))
	}
	for _, n := range []int{3, 7, 31, 150, 600} {
		for _, rf := range []int{1, 2, 20, 57, 1000} {
			for _, parts := range []int{0, 271, 1009, 30011} {
				if parts != 0 && parts < n {
					continue
				}
				if n*rf > 200000 {
					continue
				}
				cfg := DefaultConfig()
				cfg.ReplicationFactor, cfg.PartitionCount = rf, parts
				cfg.PartitionLoad = []float64{1.01, 1.1, 1.25, 2}[rng.IntN(4)]
				cfg.OverflowDepth = []int{1, 3, 8, 64}[rng.IntN(4)]
				add(fmt.Sprintf("mixed=%d/rf=%d/parts=%d/load=%g/depth=%d", n, rf, parts, cfg.PartitionLoad, cfg.OverflowDepth), cfg, mixed(n))
			}
		}
	}
	for _, n := range []int{2, 7, 12, 64, 150} {
		for _, hn := range []struct {
			name string
			h    func([]byte) uint64
		}{{"weak", weak}, {"tiny", tiny}} {
			hname, h := hn.name, hn.h
			for _, rf := range []int{1, 20, 200} {
				cfg := DefaultConfig()
				cfg.Hash, cfg.ReplicationFactor = h, rf
				cfg.PartitionCount = []int{0, 13, 271}[rng.IntN(3)]
				if cfg.PartitionCount != 0 && cfg.PartitionCount < n {
					cfg.PartitionCount = 0
				}
				cfg.PartitionLoad = []float64{1.01, 1.25, 2}[rng.IntN(3)]
				add(fmt.Sprintf("gpus=%d/%s/rf=%d/parts=%d/load=%g", n, hname, rf, cfg.PartitionCount, cfg.PartitionLoad), cfg, gpus(n))
			}
		}
	}
	return cases
}

// placementDigest is a SHA-256 of what placement decides: the backend IDs
// in index order, every partition's owner and overflow order, and the same
// after a few moves; or of the error when New refuses the layout.
func placementDigest(cfg Config, bs []Backend) string {
	h := sha256.New()
	r, err := New(cfg, bs)
	if err != nil {
		fmt.Fprintf(h, "error %v", err)
		return hex.EncodeToString(h.Sum(nil))
	}
	writeRing := func(r *Ring) {
		fmt.Fprintf(h, "%d %d\n", r.Partitions(), len(r.Backends()))
		for _, b := range r.Backends() {
			fmt.Fprintf(h, "%s\n", b.ID)
		}
		var buf [4]byte
		for p := 0; p < r.Partitions(); p++ {
			for _, b := range r.Order(p) {
				binary.LittleEndian.PutUint32(buf[:], uint32(b))
				h.Write(buf[:])
			}
		}
	}
	writeRing(r)
	if r.Partitions() > 0 {
		moves := []Move{
			{Partition: 0, Backend: r.Backends()[len(bs)-1].ID},
			{Partition: r.Partitions() / 2, Backend: r.Backends()[0].ID},
			{Partition: r.Partitions() - 1, Backend: r.Backends()[len(bs)/2].ID},
		}
		writeRing(r.WithMoves(moves))
	}
	return hex.EncodeToString(h.Sum(nil))
}

const goldenFile = "testdata/placement.golden"

// TestPlacementGolden pins every partition's owner and overflow order for
// the goldenCases to the digests recorded in testdata/placement.golden.
// Routers of different versions in one cluster must route alike, so no
// change to how a ring is built may change a digest; -update-golden
// rewrites the file and is only for a deliberate, cluster-wide change of
// placement.
func TestPlacementGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("builds about 250 rings")
	}
	cases := goldenCases()
	got := make(map[string]string, len(cases))
	var names []string
	for _, c := range cases {
		if _, dup := got[c.name]; dup {
			t.Fatalf("duplicate golden case %s", c.name)
		}
		got[c.name] = placementDigest(c.cfg, c.bs)
		names = append(names, c.name)
	}
	if *updateGolden {
		var sb strings.Builder
		sb.WriteString("# Placement digests (see TestPlacementGolden). Regenerate only for a\n# deliberate, cluster-wide change of placement: go test -run TestPlacementGolden ./ring -update-golden\n")
		for _, n := range names {
			fmt.Fprintf(&sb, "%s %s\n", n, got[n])
		}
		if err := os.WriteFile(filepath.FromSlash(goldenFile), []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(filepath.FromSlash(goldenFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, digest, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("bad golden line %q", line)
		}
		want[name] = digest
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(got) {
		t.Errorf("golden file has %d cases, the test %d", len(want), len(got))
	}
	for _, n := range names {
		if w, ok := want[n]; !ok {
			t.Errorf("%s: not in %s", n, goldenFile)
		} else if w != got[n] {
			t.Errorf("%s: placement digest %s, golden %s", n, got[n], w)
		}
	}
}
