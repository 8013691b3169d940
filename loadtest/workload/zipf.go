package workload

import (
	"math"
	"math/rand/v2"
	"sort"
)

// zipf draws item indexes 0..n-1 with probability proportional to
// 1/(i+1)^s. Unlike math/rand's Zipf it accepts any s >= 0 (0 is uniform),
// which covers the mild skews measured in production traffic.
type zipf struct {
	cdf []float64
}

func newZipf(n int, s float64) *zipf {
	cdf := make([]float64, n)
	sum := 0.0
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[n-1] = 1
	return &zipf{cdf: cdf}
}

// draw returns an index in [0, n).
func (z *zipf) draw(r *rand.Rand) int {
	u := r.Float64()
	return sort.Search(len(z.cdf)-1, func(i int) bool { return z.cdf[i] > u })
}

// prob returns the probability of item i.
func (z *zipf) prob(i int) float64 {
	if i == 0 {
		return z.cdf[0]
	}
	return z.cdf[i] - z.cdf[i-1]
}
