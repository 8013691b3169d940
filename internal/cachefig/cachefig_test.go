package cachefig

import "testing"

func TestAddAndSince(t *testing.T) {
	a := Figures{Kind: "affinity", Answers: 10, Reported: 8, PredictedWarm: 6, DeliveredWarm: 4, BothWarm: 3,
		PromptTokens: 1000, CachedTokens: 250, PredictedTokens: 200}
	var sum Figures
	sum.Add(a)
	sum.Add(a)
	if sum.Answers != 20 || sum.Reported != 16 || sum.CachedTokens != 500 || sum.PredictedHitRate != 0.75 ||
		sum.DeliveredHitRate != 0.5 || sum.TokenHitRate != 0.25 {
		t.Fatalf("sum %+v", sum)
	}
	d := sum.Since(a)
	if d.Kind != "" || d.Answers != 10 || d.PredictedTokens != 200 || d.DeliveredHitRate != 0.5 {
		t.Fatalf("since %+v", d)
	}
	// A counter that went down (a restart) counts from 0.
	restarted := Figures{Kind: "split", Answers: 3, Reported: 2, DeliveredWarm: 1, PromptTokens: 10}
	d = restarted.Since(a)
	if d.Kind != "split" || d.Answers != 3 || d.Reported != 2 || d.DeliveredHitRate != 0.5 || d.TokenHitRate != 0 {
		t.Fatalf("after a restart %+v", d)
	}
	// Nothing to divide by: rates 0.
	var z Figures
	z.Rates()
	if z.PredictedHitRate != 0 || z.TokenHitRate != 0 {
		t.Fatalf("zero %+v", z)
	}
}
