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
			c.Add(hotKey, 0)
			c.Add(rng.Uint64(), 1)
			continue
		}
		c.Add(rng.Uint64(), 0)
	}
}

func TestRotateSplitsHotPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := New()
	const hotKey = 0xfeed
	var cur []ring.Split
	for round := 0; round < 4; round++ {
		feed(c, rng, 400, 0.4, hotKey)
		cur = c.Rotate(7, cur)
	}
	if len(cur) != 1 || cur[0] != (ring.Split{Key: hotKey, Depth: 0}) {
		t.Fatalf("splits %+v, want the hot prefix alone", cur)
	}
	// Below a fair share (1/7) but above half of it: kept.
	for round := 0; round < 6; round++ {
		feed(c, rng, 400, 0.10, hotKey)
		cur = c.Rotate(7, cur)
	}
	if len(cur) != 1 {
		t.Fatalf("a split at 10%% of traffic (keep above 7%%) was dropped: %+v", cur)
	}
	// Cold: dropped after the counts decay.
	for round := 0; round < 8; round++ {
		feed(c, rng, 400, 0.01, hotKey)
		cur = c.Rotate(7, cur)
	}
	if len(cur) != 0 {
		t.Fatalf("a cold prefix stays split: %+v", cur)
	}
}

func TestRotateNeedsVolumeAndShare(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	c := New()
	// A request or three never splits, whatever their share.
	feed(c, rng, 3, 1, 7)
	if got := c.Rotate(7, nil); len(got) != 0 {
		t.Fatalf("3 requests split %+v", got)
	}
	// 10% of traffic on 7 backends is under a fair share.
	c = New()
	for round := 0; round < 4; round++ {
		feed(c, rng, 1000, 0.10, 7)
		if got := c.Rotate(7, nil); len(got) != 0 {
			t.Fatalf("round %d: a 10%% prefix split on 7 backends: %+v", round, got)
		}
	}
	// On 2 backends a fair share is 50%: 40% does not split either.
	for round := 0; round < 4; round++ {
		feed(c, rng, 1000, 0.40, 7)
		if got := c.Rotate(2, nil); len(got) != 0 {
			t.Fatalf("round %d: a 40%% prefix split on 2 backends: %+v", round, got)
		}
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
		cur = c.Rotate(4, cur)
	}
	wg.Wait()
	cur = c.Rotate(4, cur)
	if len(cur) > MaxSplits {
		t.Fatalf("%d splits", len(cur))
	}
}

func BenchmarkAdd(b *testing.B) {
	c := New()
	var k uint64
	b.ReportAllocs()
	for b.Loop() {
		k += 0x9e3779b97f4a7c15
		c.Add(k, 1)
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
			c.Add(info.KeyAt(d), d)
		}
	}
	got := c.Rotate(7, nil)
	depths := map[int]bool{}
	for _, s := range got {
		depths[s.Depth] = true
	}
	for d := 0; d < 7; d++ {
		if !depths[d] {
			t.Fatalf("after one period the shared prefix's block %d is not split (splits at depths %v, %d blocks read)", d, depths, info.Blocks)
		}
	}
	if len(got) != 7 {
		t.Fatalf("%d splits, want the 7 shared blocks only: %+v", len(got), got)
	}
}
