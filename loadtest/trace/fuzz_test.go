package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/warmroute/warmroute/loadtest/workload"
)

func FuzzParse(f *testing.F) {
	if sample, err := os.ReadFile("testdata/sample.jsonl"); err == nil {
		f.Add(sample)
	}
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0, 1]}`,
		`{"timestamp": 3.5, "input_length": 16, "output_length": 0, "hash_ids": [9]}` + "\r\n\n" + `{"timestamp":1,"input_length":40,"output_length":2,"hash_ids":[9,4,5]}`,
		`{"timestamp": 1, "input_length": 33, "output_length": 1, "hash_ids": [0, 1]}`, // floor convention
		`{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0, 1, 2]}`,
		`{"timestamp": -1, "input_length": 20, "output_length": 4, "hash_ids": [0, 1]}`,
		`{"timestamp": 0, "input_length": 1e9, "output_length": 4, "hash_ids": [0]}`,
		`{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0, 1.0]}`,
		`{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [[0], 1]}`,
		`{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": "0,1"}`,
		`{"hash_ids": [0, 1], "hash_ids": [2]}`, `[]`, `null`, ``, "\n\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const block = 16
		recs, err := Parse(bytes.NewReader(data), ParseConfig{BlockTokens: block, MaxLineBytes: 4096, MaxHashIDs: 64, MaxRecords: 100})
		if err != nil {
			return
		}
		if len(recs) > 100 {
			t.Fatalf("%d records past the limit", len(recs))
		}
		for i := range recs {
			if err := checkRecord(&recs[i], block, 64); err != nil {
				t.Fatalf("accepted record %+v: %v", recs[i], err)
			}
		}
		if len(recs) == 0 {
			return
		}
		c := DefaultReplayConfig()
		c.BlockTokens, c.MaxHashIDs, c.Model = block, 64, "m"
		p, err := NewReplay(recs, c)
		if err != nil {
			t.Fatalf("replay of accepted records: %v", err)
		}
		var req workload.Request
		for range min(p.Len(), 8) {
			if _, ok := p.NextAt(&req); !ok {
				t.Fatal("replay ended early")
			}
			var body struct {
				Prompt    string `json:"prompt"`
				MaxTokens int    `json:"max_tokens"`
			}
			if err := json.Unmarshal(req.Body, &body); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			if body.MaxTokens < 1 || body.MaxTokens > c.MaxTokens {
				t.Fatalf("max_tokens %d", body.MaxTokens)
			}
		}
	})
}
