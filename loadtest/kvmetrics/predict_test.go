package kvmetrics

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// TestParsePredictions: a router's prediction counters summed over its
// backends per kind; answers without a usage report count as answers
// only; values that are no count are skipped.
func TestParsePredictions(t *testing.T) {
	text := `# HELP warmroute_cache_answers_total Answers.
# TYPE warmroute_cache_answers_total counter
warmroute_cache_answers_total{backend="a",delivered="warm",kind="affinity",predicted="warm"} 6
warmroute_cache_answers_total{backend="b",delivered="warm",kind="affinity",predicted="warm"} 2
warmroute_cache_answers_total{backend="a",delivered="cold",kind="affinity",predicted="warm"} 1
warmroute_cache_answers_total{backend="a",delivered="warm",kind="affinity",predicted="cold"} 1
warmroute_cache_answers_total{backend="a",delivered="cold",kind="affinity",predicted="cold"} 3
warmroute_cache_answers_total{backend="a",delivered="unknown",kind="affinity",predicted="warm"} 4
warmroute_cache_answers_total{backend="a",delivered="cold",kind="overflow",predicted="cold"} 2
warmroute_cache_answers_total{backend="a",delivered="cold",kind="overflow",predicted="warm"} NaN
warmroute_cache_answers_total{backend="a",delivered="cold",kind="overflow",predicted="warm"} -3
# TYPE warmroute_cache_prompt_tokens_total counter
warmroute_cache_prompt_tokens_total{backend="a",kind="affinity",predicted="warm"} 9000
warmroute_cache_prompt_tokens_total{backend="a",kind="affinity",predicted="cold"} 4000
warmroute_cache_prompt_tokens_total{backend="a",kind="overflow",predicted="cold"} 2000
# TYPE warmroute_cache_cached_tokens_total counter
warmroute_cache_cached_tokens_total{backend="a",kind="affinity",predicted="warm"} 8000
warmroute_cache_cached_tokens_total{backend="a",kind="affinity",predicted="cold"} 500
warmroute_cache_cached_tokens_total{backend="a",kind="overflow",predicted="cold"} 0
# TYPE warmroute_cache_predicted_tokens_total counter
warmroute_cache_predicted_tokens_total{backend="a",kind="affinity"} 2304
warmroute_cache_predicted_tokens_total{backend="a",kind="overflow"} 0
# TYPE warmroute_requests_total counter
warmroute_requests_total{backend="a",code="200",decision="affinity",route="chat"} 19
`
	got, err := ParsePredictions(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := stats.PredictionCounters{
		"affinity": {Kind: "affinity", Answers: 17, Reported: 13, PredictedWarm: 9, DeliveredWarm: 9, BothWarm: 8,
			PromptTokens: 13000, CachedTokens: 8500, PredictedTokens: 2304},
		"overflow": {Kind: "overflow", Answers: 2, Reported: 2, PromptTokens: 2000},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}

	// A router without answers yet, and one that is not a router.
	if got, err := ParsePredictions(strings.NewReader("warmroute_ring_epoch 3\n")); err != nil || len(got) != 0 {
		t.Fatalf("no counters: %+v %v", got, err)
	}
	if _, err := ParsePredictions(strings.NewReader("{{{\n")); !errors.Is(err, ErrParse) {
		t.Fatalf("malformed: %v", err)
	}
}
