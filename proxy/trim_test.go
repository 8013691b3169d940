package proxy

import "testing"

func TestTrimmerReturnsAfterABurstOnly(t *testing.T) {
	var tr trimmer
	steps := []struct {
		open int64
		want bool
	}{
		{10, false}, {200, false}, {40, false}, // a peak under trimMinPeak: never
		{2000, false}, {1500, false}, {600, false}, // not yet a quarter
		{500, true},  // a quarter of the peak: return, and 500 is the new peak
		{400, false}, // not a quarter of 500
		{10, true},   // a quarter of 500
		{5, false},   // the peak is now 10, under trimMinPeak
		{300, false}, // a new peak
		{80, false},  // above a quarter of 300
		{75, true},   // a quarter of 300
	}
	for i, s := range steps {
		if got := tr.sample(s.open); got != s.want {
			t.Fatalf("step %d (open %d, peak %d): %v, want %v", i, s.open, tr.peak, got, s.want)
		}
	}
}
