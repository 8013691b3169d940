package hot

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// feed counts n requests: share of them under the hot prefix (depth 0)
// with a distinct continuation each (depth 1), the rest on cold keys.
func feed(c *Counter, rng *rand.Rand, n int, share float64, hotKey uint64) {
	for i := 0; i < n; i++ {
		c.Request()
		if rng.Float64() < share {
			c.Add(hotKey, 0, 3)
			c.Add(rng.Uint64(), 1, 3)
			continue
		}
		c.Add(rng.Uint64(), 0, 5)
	}
}

// splitsOf returns the candidates as splits, and the count of key.
func splitsOf(cands []Candidate, key uint64) ([]ring.Split, uint64) {
	var out []ring.Split
	var n uint64
	for _, c := range cands {
		out = append(out, ring.Split{Key: c.Key, Depth: c.Depth})
		if c.Key == key {
			n = c.Count
		}
	}
	return out, n
}

// TestRotateReportsHotPrefix: a prefix with 40% of the requests is
// reported with its count and routing partition, and the splits in use
// are reported while they are counted at all, with their counts, for the
// leader to judge; a cold one is dropped.
func TestRotateReportsHotPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := New()
	const hotKey = 0xfeed
	var cur []ring.Split
	var total uint64
	for round := 0; round < 4; round++ {
		feed(c, rng, 400, 0.4, hotKey)
		var cands []Candidate
		total, cands = c.Rotate(7, cur)
		if len(cands) != 1 || cands[0].Key != hotKey || cands[0].Depth != 0 || cands[0].Part != 3 {
			t.Fatalf("round %d: candidates %+v, want the hot prefix alone, on partition 3", round, cands)
		}
		cur, _ = splitsOf(cands, hotKey)
	}
	if total < 400*Unit {
		t.Fatalf("total %d after four rounds of 400 requests", total)
	}
	// Below a fair share: still reported, being in use, with its count.
	var n uint64
	for round := 0; round < 10; round++ {
		feed(c, rng, 400, 0.05, hotKey)
		var cands []Candidate
		total, cands = c.Rotate(7, cur)
		if _, n = splitsOf(cands, hotKey); n == 0 {
			t.Fatalf("round %d: a split at 5%% of traffic not reported", round)
		}
	}
	if n*7 >= total {
		t.Fatalf("a split at 5%% of traffic reported with count %d of %d", n, total)
	}
	// Cold: no longer reported once the counts decay to nothing.
	for round := 0; round < 40; round++ {
		feed(c, rng, 400, 0, hotKey)
		_, cands := c.Rotate(7, cur)
		if _, n := splitsOf(cands, hotKey); n == 0 {
			return
		}
	}
	t.Fatal("a cold prefix is still reported")
}

func TestRotateNeedsShare(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// 10% of traffic on 7 backends is under a fair share.
	c := New()
	for round := 0; round < 4; round++ {
		feed(c, rng, 1000, 0.10, 7)
		if _, got := c.Rotate(7, nil); len(got) != 0 {
			t.Fatalf("round %d: a 10%% prefix reported on 7 backends: %+v", round, got)
		}
	}
	// On 2 backends a fair share is 50%: 40% is not reported either.
	for round := 0; round < 4; round++ {
		feed(c, rng, 1000, 0.40, 7)
		if _, got := c.Rotate(2, nil); len(got) != 0 {
			t.Fatalf("round %d: a 40%% prefix reported on 2 backends: %+v", round, got)
		}
	}
	// One request a period, all on one prefix (an eighth of a fleet's
	// traffic behind eight routers): reported, for the leader to add up.
	c = New()
	var cands []Candidate
	for round := 0; round < 4; round++ {
		feed(c, rng, 1, 1, 7)
		_, cands = c.Rotate(7, nil)
	}
	if _, n := splitsOf(cands, 7); n == 0 {
		t.Fatalf("a prefix at one request a period is not reported: %+v", cands)
	}
}

func TestConcurrentAdd(t *testing.T) {
	c := New()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			feed(c, rng, 5000, 0.5, 99)
		}(g)
	}
	var cur []ring.Split
	for i := 0; i < 20; i++ {
		_, cands := c.Rotate(4, cur)
		cur, _ = splitsOf(cands, 0)
	}
	wg.Wait()
	_, cands := c.Rotate(4, cur)
	if len(cands) > MaxReport {
		t.Fatalf("%d candidates", len(cands))
	}
}

func BenchmarkAdd(b *testing.B) {
	c := New()
	var k uint64
	b.ReportAllocs()
	for b.Loop() {
		k += 0x9e3779b97f4a7c15
		c.Add(k, 1, 0)
	}
}

// TestSharedPrefixSplitInOneRound reads prompts the way the proxy does:
// with no split, Extract reads ring's ChainBlocks() blocks and every depth
// read is counted. A 7 KiB prefix shared by every request (an agent's tool
// prompt) must be split whole after one counting period, not one look-ahead
// window a period: sessions that start between two rounds would lose their
// history at the second.
func TestSharedPrefixSplitInOneRound(t *testing.T) {
	shared := make([]byte, 7*ring.ChainBlockBytes)
	for i := range shared {
		shared[i] = 'a' + byte(i%26)
	}
	c := New()
	var splits *ring.Splits
	kc := ring.KeyConfig{ChainBlocks: splits.ChainBlocks()}
	var info ring.KeyInfo
	for i := 0; i < 64; i++ {
		body := fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"session %d: %s"}]}`,
			shared, i, strings.Repeat("task words ", 200))
		if err := ring.Extract(kc, ring.Chat, []byte(body), nil, &info); err != nil {
			t.Fatal(err)
		}
		c.Request()
		for d := 0; d < info.Blocks; d++ {
			c.Add(info.KeyAt(d), d, 0)
		}
	}
	_, cands := c.Rotate(7, nil)
	got, _ := splitsOf(cands, 0)
	depths := map[int]bool{}
	for _, s := range got {
		depths[s.Depth] = true
	}
	for d := 0; d < 7; d++ {
		if !depths[d] {
			t.Fatalf("after one period the shared prefix's block %d is not a candidate (candidates at depths %v, %d blocks read)", d, depths, info.Blocks)
		}
	}
	if len(got) != 7 {
		t.Fatalf("%d candidates, want the 7 shared blocks only: %+v", len(got), got)
	}
}
