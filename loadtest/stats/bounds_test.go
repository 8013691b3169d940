package stats

import (
	"errors"
	"testing"
)

// chains of blocks of 4 tokens, named by letters for reading
const (
	ha uint64 = iota + 1
	hb
	hc
	hd
	hx
	hy
	hp
)

func newTestBounds(t *testing.T, c BoundsConfig) *Bounds {
	t.Helper()
	b, err := NewBounds(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkResult(t *testing.T, got BoundsResult, queried, hit, fleetHit int64) {
	t.Helper()
	if got.QueriedTokens != queried || got.HitTokens != hit || got.FleetHitTokens != fleetHit {
		t.Fatalf("queried %d, hit %d, fleet hit %d; want %d, %d, %d",
			got.QueriedTokens, got.HitTokens, got.FleetHitTokens, queried, hit, fleetHit)
	}
	if want := float64(hit) / float64(queried); got.HitRate != want {
		t.Fatalf("hit rate %g, want %g", got.HitRate, want)
	}
	if want := float64(fleetHit) / float64(queried); got.FleetHitRate != want {
		t.Fatalf("fleet hit rate %g, want %g", got.FleetHitRate, want)
	}
}

// Three requests that fit everywhere: both bounds are the prefix hits.
func TestBoundsThreeRequests(t *testing.T) {
	b := newTestBounds(t, BoundsConfig{Caches: 2, CacheBlocks: 10, BlockTokens: 4, LoadFactor: 100})
	b.Add([]uint64{ha, hb, hc}, 12, true) // nothing seen; at most (12-1)/4 = 2 blocks could hit
	b.Add([]uint64{ha, hb, hd}, 13, true) // a, b: 8 tokens
	b.Add([]uint64{ha, hb, hc}, 12, true) // a, b, c seen, but only 2 blocks can hit: 8 tokens
	r := b.Result()
	checkResult(t, r, 37, 16, 16)
	if r.Requests != 3 || r.DistinctBlocks != 4 || r.Truncated || r.Caches != 2 || r.CacheBlocks != 10 || r.BlockTokens != 4 {
		t.Fatalf("result %+v", r)
	}
}

// Small caches: the fleet forgets what the infinite cache keeps, new
// prefixes go to the cache used least recently, and a warm-up request
// fills the caches without being counted.
func TestBoundsFiniteCaches(t *testing.T) {
	for _, warm := range []bool{false, true} {
		b := newTestBounds(t, BoundsConfig{Caches: 2, CacheBlocks: 3, BlockTokens: 4, LoadFactor: 100})
		b.Add([]uint64{ha, hb, hc}, 12, !warm) // cache 0 (tie, lowest index): c, b, a (a most recent)
		b.Add([]uint64{hx, hy}, 9, true)       // no match anywhere: cache 1, used least recently
		if _, ok := b.caches[1].m[hx]; !ok {
			t.Fatal("a new prefix did not go to the cache used least recently")
		}
		b.Add([]uint64{ha, hb, hd}, 12, true) // cache 0 (a, b); d evicts c, its least recently used
		b.Add([]uint64{ha, hb, hc}, 13, true) // infinite: a, b, c (3 blocks); cache 0: a, b (2)
		r := b.Result()
		if warm {
			checkResult(t, r, 9+12+13, 20, 16)
			if r.Requests != 3 || r.Unmeasured != 1 {
				t.Fatalf("requests %d unmeasured %d", r.Requests, r.Unmeasured)
			}
		} else {
			checkResult(t, r, 12+9+12+13, 20, 16)
		}
	}
}

// The load cap sends a request away from the cache with the longest match
// once that cache has more than its share.
func TestBoundsLoadCap(t *testing.T) {
	b := newTestBounds(t, BoundsConfig{Caches: 2, CacheBlocks: 10, BlockTokens: 4, LoadFactor: 1})
	for range 4 {
		b.Add([]uint64{ha, hb}, 9, true)
	}
	// caps ceil(n/2) for the n-th request: cache 0, cache 1 (cache 0 is
	// full), cache 0 (both hold a, b; it was used less recently), cache 1
	checkResult(t, b.Result(), 36, 24, 16)
	if b.load[0] != 2 || b.load[1] != 2 {
		t.Fatalf("loads %v", b.load)
	}
	if r := b.Result(); r.LoadFactor != 1 {
		t.Fatalf("load factor %g", r.LoadFactor)
	}
	if r := newTestBounds(t, BoundsConfig{Caches: 1, CacheBlocks: 1, BlockTokens: 1}).Result(); r.LoadFactor != DefaultBoundLoadFactor {
		t.Fatalf("default load factor %g", r.LoadFactor)
	}
}

// A finished request's deeper blocks are evicted before its first ones.
func TestBoundsEvictDeeperBlocksFirst(t *testing.T) {
	b := newTestBounds(t, BoundsConfig{Caches: 1, CacheBlocks: 2, BlockTokens: 4})
	b.Add([]uint64{ha, hb}, 9, true)
	b.Add([]uint64{hp}, 5, true)     // evicts b, not a
	b.Add([]uint64{ha, hb}, 9, true) // a only
	checkResult(t, b.Result(), 23, 8, 4)
}

func TestBoundsTruncate(t *testing.T) {
	b := newTestBounds(t, BoundsConfig{Caches: 1, CacheBlocks: 8, BlockTokens: 4, MaxBlocks: 4})
	b.Add([]uint64{ha, hb, hc}, 12, true)
	b.Add([]uint64{ha, hb, hc}, 13, true) // no new block
	b.Add([]uint64{hx, hy}, 9, true)      // 3 + 2 > 4
	b.Add([]uint64{ha}, 5, true)
	r := b.Result()
	if !r.Truncated || r.Skipped != 2 || r.Requests != 2 {
		t.Fatalf("result %+v", r)
	}
	checkResult(t, r, 25, 12, 12)
}

func TestBoundsEmptyAndShort(t *testing.T) {
	b := newTestBounds(t, BoundsConfig{Caches: 3, CacheBlocks: 8, BlockTokens: 4})
	if r := b.Result(); r.HitRate != 0 || r.FleetHitRate != 0 {
		t.Fatalf("empty: %+v", r)
	}
	b.Add(nil, 3, true) // shorter than a block
	b.Add(nil, 3, true)
	b.Skip()
	r := b.Result()
	checkResult(t, r, 6, 0, 0)
	if r.Skipped != 1 {
		t.Fatalf("skipped %d", r.Skipped)
	}
}

func TestBoundsConfigValidate(t *testing.T) {
	for _, c := range []BoundsConfig{
		{Caches: 0, CacheBlocks: 1, BlockTokens: 1},
		{Caches: 1025, CacheBlocks: 1, BlockTokens: 1},
		{Caches: 1, CacheBlocks: 0, BlockTokens: 1},
		{Caches: 1, CacheBlocks: 1<<24 + 1, BlockTokens: 1},
		{Caches: 1, CacheBlocks: 1, BlockTokens: 0},
		{Caches: 1, CacheBlocks: 1, BlockTokens: 1, MaxBlocks: -1},
		{Caches: 1, CacheBlocks: 1, BlockTokens: 1, LoadFactor: 0.9},
	} {
		if _, err := NewBounds(c); !errors.Is(err, ErrBadBounds) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
