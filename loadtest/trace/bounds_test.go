package trace

import (
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// Three requests with blocks of 16 tokens, one gpusim block each:
//
//	A at 0 s:  ids 0 1,   32 tokens: blocks h0 h01, at most 1 can hit
//	B at 1 s:  ids 0 1 2, 40 tokens: blocks h0 h01 (the third is partial), at most 2
//	C at 2 s:  ids 0 3,   32 tokens: blocks h0 h03, at most 1
//
// Infinite cache: A 0, B 32 (h0 h01), C 16 (h0) of 104 tokens. Two
// caches with the default load cap of 1.25: A and B on cache 0 (B hits
// 32), C over cache 0's cap (ceil(1.25 x 3 / 2) = 2 requests) on cache 1,
// cold: 32 of 104.
func TestBoundsOfAReplay(t *testing.T) {
	recs := []Record{
		{Line: 1, Timestamp: 0, InputLength: 32, OutputLength: 1, HashIDs: []int64{0, 1}},
		{Line: 2, Timestamp: time.Second, InputLength: 40, OutputLength: 1, HashIDs: []int64{0, 1, 2}},
		{Line: 3, Timestamp: 2 * time.Second, InputLength: 32, OutputLength: 1, HashIDs: []int64{0, 3}},
	}
	c := DefaultReplayConfig()
	c.BlockTokens = 16
	bc := stats.BoundsConfig{Caches: 2, CacheBlocks: 100, BlockTokens: 16}
	for _, tc := range []struct {
		warmup                 time.Duration
		queried, hit, fleetHit int64
	}{
		{0, 104, 48, 32},
		{500 * time.Millisecond, 72, 48, 32}, // A warms the caches unmeasured
	} {
		p, err := NewReplay(recs, c)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Bounds(p, bc, 4, tc.warmup)
		if err != nil {
			t.Fatal(err)
		}
		if r.QueriedTokens != tc.queried || r.HitTokens != tc.hit || r.FleetHitTokens != tc.fleetHit || r.Skipped != 0 {
			t.Fatalf("warm-up %v: %+v, want %d queried, %d and %d hit", tc.warmup, r, tc.queried, tc.hit, tc.fleetHit)
		}
		if r.HitRate != float64(tc.hit)/float64(tc.queried) || r.FleetHitRate != float64(tc.fleetHit)/float64(tc.queried) {
			t.Fatalf("rates %+v", r)
		}
	}
}
