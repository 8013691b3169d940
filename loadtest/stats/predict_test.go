package stats

import (
	"reflect"
	"testing"
)

func TestPredictionDelta(t *testing.T) {
	start := PredictionCounters{
		"affinity": {Answers: 10, Reported: 8, PredictedWarm: 5, DeliveredWarm: 5, BothWarm: 4, PromptTokens: 8000, CachedTokens: 4000, PredictedTokens: 1280},
		"overflow": {Answers: 3, Reported: 3, PromptTokens: 3000},
		"fallback": {Answers: 50, Reported: 50, PromptTokens: 100},
	}
	end := PredictionCounters{}
	end.Add(PredictionCounters{
		"affinity": {Answers: 20, Reported: 16, PredictedWarm: 13, DeliveredWarm: 12, BothWarm: 11, PromptTokens: 16000, CachedTokens: 10000, PredictedTokens: 3328},
		"overflow": {Answers: 3, Reported: 3, PromptTokens: 3000}, // nothing new
		"moved":    {Answers: 1},                                  // a kind this version does not know
		"fallback": {Answers: 4, Reported: 4, PromptTokens: 40},   // a router restarted
	})
	got := PredictionDelta(start, end)
	want := []Prediction{
		{Kind: "affinity", Answers: 10, Reported: 8, PredictedWarm: 8, DeliveredWarm: 7, BothWarm: 7, PromptTokens: 8000, CachedTokens: 6000, PredictedTokens: 2048,
			PredictedHitRate: 1, DeliveredHitRate: 7.0 / 8, TokenHitRate: 0.75},
		{Kind: "fallback", Answers: 4, Reported: 4, PromptTokens: 40},
		{Kind: "moved", Answers: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if got := PredictionDelta(nil, PredictionCounters{}); got != nil {
		t.Fatalf("nothing counted: %+v", got)
	}
}
