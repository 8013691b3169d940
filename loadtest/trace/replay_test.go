package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/workload"
)

func TestBlocks(t *testing.T) {
	a := AppendBlock(nil, 12, 2048)
	if len(a) != 2048 || !bytes.HasPrefix(a, []byte("[12] ")) {
		t.Fatalf("block 12: %d bytes, starts %q", len(a), a[:8])
	}
	if !bytes.Equal(a, AppendBlock(nil, 12, 2048)) {
		t.Fatal("block 12 is not deterministic")
	}
	if !bytes.Equal(AppendBlock([]byte("x"), 12, 100), append([]byte("x"), a[:100]...)) {
		t.Fatal("a short block is not the start of the whole one")
	}
	// ids that are each other's decimal prefixes differ from their first
	// bytes, well inside gpusim's first 16-token block
	for _, id := range []int64{1, 121, 1212, 0, 2} {
		if b := AppendBlock(nil, id, 2048); bytes.Equal(b[:8], a[:8]) {
			t.Fatalf("blocks 12 and %d start alike: %q", id, b[:8])
		}
	}
	for _, c := range a {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("[] .", c) >= 0) {
			t.Fatalf("block text has %q", c)
		}
	}
}

func TestPrompts(t *testing.T) {
	a := Record{Line: 1, InputLength: 1500, HashIDs: []int64{0, 1, 2}}
	b := Record{Line: 2, InputLength: 1400, HashIDs: []int64{0, 1, 3}}
	c := Record{Line: 3, InputLength: 1100, HashIDs: []int64{0, 1}} // one id short: its own tail
	pa, pb, pc := AppendPrompt(nil, &a, 512, 4), AppendPrompt(nil, &b, 512, 4), AppendPrompt(nil, &c, 512, 4)
	if len(pa) != 6000 || len(pb) != 5600 || len(pc) != 4400 {
		t.Fatalf("lengths %d %d %d", len(pa), len(pb), len(pc))
	}
	if !bytes.Equal(pa[:4096], pb[:4096]) || !bytes.Equal(pa[:4096], pc[:4096]) {
		t.Fatal("equal hash-id prefixes are not byte-equal")
	}
	if !bytes.HasPrefix(pa[4096:], []byte("[2] ")) || !bytes.HasPrefix(pb[4096:], []byte("[3] ")) || !bytes.HasPrefix(pc[4096:], []byte("[tail 3] ")) {
		t.Fatalf("third blocks start %q, %q, %q", pa[4096:4104], pb[4096:4104], pc[4096:4104])
	}
	// gpusim sees exactly the two shared blocks: 2 x 512 tokens = 64
	// blocks of 16, then different blocks
	body := func(p []byte) []byte { return []byte(`{"prompt":"` + string(p) + `"}`) }
	ca, ta, err := gpusim.PromptBlocks(workload.PathCompletions, body(pa), 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	cb, tb, err := gpusim.PromptBlocks(workload.PathCompletions, body(pb), 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	if ta != 1500 || tb != 1400 {
		t.Fatalf("gpusim counts %d and %d tokens", ta, tb)
	}
	shared := 0
	for shared < min(len(ca), len(cb)) && ca[shared] == cb[shared] {
		shared++
	}
	if shared != 64 {
		t.Fatalf("gpusim shares %d blocks, want 64", shared)
	}
}

func TestReplayBodies(t *testing.T) {
	recs := []Record{
		{Line: 1, Timestamp: 0, InputLength: 30, OutputLength: 500, HashIDs: []int64{0, 1}},
		{Line: 2, Timestamp: time.Second, InputLength: 20, OutputLength: 0, HashIDs: []int64{0, 2}},
	}
	c := DefaultReplayConfig()
	c.BlockTokens, c.Model = 16, `llama "3"`
	p, err := NewReplay(recs, c)
	if err != nil {
		t.Fatal(err)
	}
	var req workload.Request
	for i, wantMax := range []int{128, 1} {
		if _, ok := p.NextAt(&req); !ok {
			t.Fatal("ended early")
		}
		var body struct {
			Model         string `json:"model"`
			Prompt        string `json:"prompt"`
			MaxTokens     int    `json:"max_tokens"`
			Stream        bool   `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(req.Body, &body); err != nil {
			t.Fatalf("body %d: %v", i, err)
		}
		if body.Model != c.Model || body.MaxTokens != wantMax || !body.Stream || !body.StreamOptions.IncludeUsage ||
			body.Prompt != string(AppendPrompt(nil, &recs[i], 16, 4)) {
			t.Fatalf("body %d: %+v", i, body)
		}
		if req.Path != workload.PathCompletions || req.Kind != Kind || req.Seq != i {
			t.Fatalf("request %d: %+v", i, req)
		}
	}
	c.Model, c.Stream = "", false
	p, _ = NewReplay(recs, c)
	p.Next(&req)
	if bytes.Contains(req.Body, []byte(`"model"`)) || bytes.Contains(req.Body, []byte(`"stream"`)) {
		t.Fatalf("body %s", req.Body)
	}
}

func TestReplayTimes(t *testing.T) {
	var recs []Record
	for i, ms := range []int{4000, 0, 1000, 3000, 2000, 2000} { // out of order, a tie
		recs = append(recs, Record{Line: i + 1, Timestamp: time.Duration(ms) * time.Millisecond,
			InputLength: 10, OutputLength: 1, HashIDs: []int64{int64(i)}})
	}
	type sent struct {
		at   time.Duration
		line int
	}
	replay := func(c ReplayConfig) []sent {
		t.Helper()
		c.BlockTokens = 16
		p, err := NewReplay(recs, c)
		if err != nil {
			t.Fatal(err)
		}
		var out []sent
		var req workload.Request
		for {
			at, ok := p.NextAt(&req)
			if !ok {
				break
			}
			out = append(out, sent{at, p.Records()[req.Seq].Line})
		}
		if out[len(out)-1].at != p.Span() || len(out) != p.Len() {
			t.Fatalf("span %v len %d, sent %v", p.Span(), p.Len(), out)
		}
		return out
	}
	check := func(name string, got, want []sent) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: got %v, want %v", name, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: got %v, want %v", name, got, want)
			}
		}
	}
	c := DefaultReplayConfig()
	check("whole", replay(c), []sent{{0, 2}, {time.Second, 3}, {2 * time.Second, 5}, {2 * time.Second, 6}, {3 * time.Second, 4}, {4 * time.Second, 1}})
	c.TimeScale = 4
	check("four times faster", replay(c), []sent{{0, 2}, {250 * time.Millisecond, 3}, {500 * time.Millisecond, 5}, {500 * time.Millisecond, 6}, {750 * time.Millisecond, 4}, {time.Second, 1}})
	c.WindowStart, c.Window = time.Second, 2*time.Second // [1s, 3s) of trace time
	check("window", replay(c), []sent{{0, 3}, {250 * time.Millisecond, 5}, {250 * time.Millisecond, 6}})
	c.MaxRequests = 2
	check("two requests", replay(c), []sent{{0, 3}, {250 * time.Millisecond, 5}})
	c = DefaultReplayConfig()
	c.WindowStart = 3500 * time.Millisecond
	check("from 3.5s", replay(c), []sent{{500 * time.Millisecond, 1}})

	c.WindowStart = 5 * time.Second
	c.BlockTokens = 16
	if _, err := NewReplay(recs, c); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "no record in the window") {
		t.Fatalf("empty window: %v", err)
	}
}

func TestReplayNextStartsOver(t *testing.T) {
	recs := []Record{{Line: 1, InputLength: 10, HashIDs: []int64{1}}, {Line: 2, InputLength: 10, HashIDs: []int64{2}}}
	c := DefaultReplayConfig()
	c.BlockTokens = 16
	p, err := NewReplay(recs, c)
	if err != nil {
		t.Fatal(err)
	}
	var req workload.Request
	var seqs []int
	for range 5 {
		p.Next(&req)
		seqs = append(seqs, req.Seq)
	}
	if got := seqs; got[0] != 0 || got[1] != 1 || got[2] != 0 || got[3] != 1 || got[4] != 0 {
		t.Fatalf("sequence %v", got)
	}
}

func TestReplayChecksRecordsAndConfig(t *testing.T) {
	c := DefaultReplayConfig()
	bad := []Record{{Line: 1, InputLength: 10, HashIDs: []int64{1}}, {Line: 9, InputLength: 1600, HashIDs: []int64{1}}}
	if _, err := NewReplay(bad, c); !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), "line 9: ") {
		t.Fatalf("bad record: %v", err)
	}
	for _, mod := range []func(*ReplayConfig){
		func(c *ReplayConfig) { c.BlockTokens = 0 },
		func(c *ReplayConfig) { c.BytesPerToken = 0 },
		func(c *ReplayConfig) { c.TimeScale = 0 },
		func(c *ReplayConfig) { c.Window = -1 },
		func(c *ReplayConfig) { c.MaxRequests = -1 },
		func(c *ReplayConfig) { c.MaxTokens = 0 },
		func(c *ReplayConfig) { c.MaxHashIDs = 0 },
	} {
		c := DefaultReplayConfig()
		mod(&c)
		if _, err := NewReplay(bad[:1], c); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// The replay's default bytes per token is gpusim's, so that a block is
// exactly BlockTokens of gpusim's tokens.
func TestBytesPerTokenIsGpusims(t *testing.T) {
	if got, want := DefaultReplayConfig().BytesPerToken, gpusim.DefaultConfig().BytesPerToken; got != want {
		t.Fatalf("replay %d bytes per token, gpusim %d", got, want)
	}
}
