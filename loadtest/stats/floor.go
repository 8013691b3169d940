package stats

import (
	"math"
	"math/rand/v2"
	"slices"
)

const (
	// floorWork bounds the random draws EvenShareFloor makes: trials x
	// requests. At 4M draws it takes tens of milliseconds.
	floorWork = 4 << 20
	// floorMaxSample is the largest sample simulated; a larger one's floor
	// is extrapolated from it.
	floorMaxSample = 1 << 20
)

// EvenShareFloor returns the median max/min share of n requests each sent
// to one of k backends uniformly at random, in 31 to 401 simulated trials
// (fewer the larger n). That is what hashing independent keys gives with
// perfect luck. A key-affine router, whose requests follow their keys
// rather than the backends' loads, cannot be expected to do better on a
// finite sample, so its ShareMaxMin is read against this floor (a choice
// per request by load, such as least-outstanding, does go below it). With
// 175 requests over 7 backends the floor is about 1.7, with 1,000 about
// 1.24. Above floorMaxSample requests it is extrapolated from that
// sample's: the spread of the counts shrinks as 1/sqrt(n). The result is 0
// when the median trial left a backend without a request (as ShareMaxMin
// is then) or when n or k is below 1. It is deterministic (a fixed seed).
func EvenShareFloor(n int64, k int) float64 {
	switch {
	case n < 1 || k < 1:
		return 0
	case k == 1:
		return 1
	case n > floorMaxSample:
		f := EvenShareFloor(floorMaxSample, k)
		return 1 + (f-1)*math.Sqrt(float64(floorMaxSample)/float64(n))
	}
	trials := int(min(max(floorWork/n, 31), 401))
	rng := rand.New(rand.NewPCG(1, uint64(n)<<8|uint64(k&0xff)))
	counts := make([]int64, k)
	ratios := make([]float64, trials)
	for t := range ratios {
		clear(counts)
		for range n {
			counts[rng.IntN(k)]++
		}
		lo, hi := slices.Min(counts), slices.Max(counts)
		if lo == 0 {
			ratios[t] = math.Inf(1)
		} else {
			ratios[t] = float64(hi) / float64(lo)
		}
	}
	slices.Sort(ratios)
	if f := ratios[trials/2]; !math.IsInf(f, 1) {
		return f
	}
	return 0
}
