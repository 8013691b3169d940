package trace

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

func smallGen() GenConfig {
	return GenConfig{Seed: 7, Requests: 2000, Rate: 40, BlockTokens: 64, MeanInputTokens: 800,
		MeanOutputTokens: 50, Turns: 5, Think: 2 * time.Second, DocShare: 0.25, Documents: 12}
}

func mustGenerate(t *testing.T, c GenConfig) []Record {
	t.Helper()
	recs, err := Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != c.Requests {
		t.Fatalf("%d records, want %d", len(recs), c.Requests)
	}
	return recs
}

func TestGenerateIsDeterministic(t *testing.T) {
	c := smallGen()
	a, b := mustGenerate(t, c), mustGenerate(t, c)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same config gave different traces")
	}
	c.Seed++
	if reflect.DeepEqual(a, mustGenerate(t, c)) {
		t.Fatal("another seed gave the same trace")
	}
	// a shorter trace is the start of a longer one
	c = smallGen()
	c.Requests = 700
	if short := mustGenerate(t, c); !reflect.DeepEqual(short, a[:700]) {
		t.Fatal("700 requests are not the first 700 of 2000")
	}
}

// kinds sorts records into conversation turns that extend an earlier
// request, questions on a document an earlier request had, and the rest
// (first turns and first questions on a document), by their hash ids.
func kinds(recs []Record, b int) (extend, shared, other int) {
	var prefixes [][]int64
	seenSecond := map[int64]bool{}
	for _, r := range recs {
		isExt := false
		for _, p := range prefixes {
			if len(p) >= 2 && len(r.HashIDs) > len(p) && slices.Equal(r.HashIDs[:len(p)], p) {
				isExt = true
				break
			}
		}
		switch {
		case isExt:
			extend++
		case len(r.HashIDs) > 1 && seenSecond[r.HashIDs[1]]:
			shared++
		default:
			other++
		}
		if len(r.HashIDs) > 1 {
			seenSecond[r.HashIDs[1]] = true
		}
		prefixes = append(prefixes, r.HashIDs[:r.InputLength/b])
	}
	return
}

func TestGenerateStructure(t *testing.T) {
	c := smallGen()
	recs := mustGenerate(t, c)
	st := Describe(recs)
	if recs[0].Timestamp != 0 || st.SharedFirst != 1 {
		t.Fatalf("first at %v, %.2f open with the system prompt", recs[0].Timestamp, st.SharedFirst)
	}
	if math.Abs(st.MeanInput/float64(c.MeanInputTokens)-1) > 0.15 {
		t.Fatalf("mean input %.0f, want about %d", st.MeanInput, c.MeanInputTokens)
	}
	if math.Abs(st.MeanOutput/float64(c.MeanOutputTokens)-1) > 0.15 {
		t.Fatalf("mean output %.0f, want about %d", st.MeanOutput, c.MeanOutputTokens)
	}
	if want := float64(c.Requests) / c.Rate; math.Abs(st.Span.Seconds()/want-1) > 0.2 {
		t.Fatalf("span %v, want about %.0fs", st.Span, want)
	}
	next := int64(0)
	for i := range recs {
		r := &recs[i]
		if i > 0 && r.Timestamp < recs[i-1].Timestamp || r.Line != i+1 || r.HashIDs[0] != 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
		if err := checkRecord(r, c.BlockTokens, DefaultMaxHashIDs); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if len(r.HashIDs) != (r.InputLength+c.BlockTokens-1)/c.BlockTokens {
			t.Fatalf("record %d: %d hash ids for %d tokens", i, len(r.HashIDs), r.InputLength)
		}
		for _, id := range r.HashIDs { // numbered by first appearance
			if id > next {
				t.Fatalf("record %d: id %d before %d", i, id, next)
			}
			if id == next {
				next++
			}
		}
	}
	extend, shared, other := kinds(recs, c.BlockTokens)
	t.Logf("%d turns extending an earlier request, %d questions on a known document, %d others", extend, shared, other)
	// 75% of requests are conversation turns, 4 in 5 of them after the
	// first; 25% are questions on 12 documents, nearly all on one seen
	if f := float64(extend) / float64(len(recs)); f < 0.5 || f > 0.7 {
		t.Fatalf("%.2f of requests extend an earlier one", f)
	}
	if f := float64(shared) / float64(len(recs)); f < 0.2 || f > 0.3 {
		t.Fatalf("%.2f of requests are on a known document", f)
	}

	c.DocShare = 0
	if _, shared, _ := kinds(mustGenerate(t, c), c.BlockTokens); shared != 0 {
		t.Fatalf("%d document questions without documents", shared)
	}
	c.DocShare = 1
	if extend, shared, _ := kinds(mustGenerate(t, c), c.BlockTokens); extend != 0 || shared < c.Requests-c.Documents {
		t.Fatalf("documents only: %d extending, %d on a known document", extend, shared)
	}
}

func TestGenerateDefaults(t *testing.T) {
	c := DefaultGenConfig()
	recs := mustGenerate(t, c)
	st := Describe(recs)
	if st.MeanInput < 2500 || st.MeanInput > 3500 || st.Span < 50*time.Second || st.Span > 75*time.Second {
		t.Fatalf("default trace: %s", st.Format(c.BlockTokens))
	}
}

func TestGenConfigValidate(t *testing.T) {
	for _, mod := range []func(*GenConfig){
		func(c *GenConfig) { c.Requests = 0 },
		func(c *GenConfig) { c.Rate = 0 },
		func(c *GenConfig) { c.BlockTokens = 0 },
		func(c *GenConfig) { c.MeanInputTokens = c.BlockTokens },
		func(c *GenConfig) { c.MeanInputTokens = DefaultMaxHashIDs * c.BlockTokens },
		func(c *GenConfig) { c.MeanOutputTokens = 0 },
		func(c *GenConfig) { c.Turns = 0 },
		func(c *GenConfig) { c.Think = 0 },
		func(c *GenConfig) { c.DocShare = 1.5 },
		func(c *GenConfig) { c.Documents = 0 },
	} {
		c := DefaultGenConfig()
		mod(&c)
		if _, err := Generate(c); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
