package reqlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/loadtest/trace"
	"github.com/warmroute/warmroute/ring"
)

// chatBody is a chat request whose prompt is prefix then suffix.
func chatBody(prefix, suffix string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "llama", "messages": []map[string]string{{"role": "user", "content": prefix + suffix}}})
	return b
}

// fill fills r as the proxy would for a routed chat request.
func fill(t *testing.T, r *Record, body []byte, prompt, completion int64) {
	t.Helper()
	var info ring.KeyInfo
	kc := ring.DefaultConfig().Key()
	kc.ChainBlocks = ring.MaxChainBlocks
	if err := ring.Extract(kc, ring.Chat, body, nil, &info); err != nil {
		t.Fatal(err)
	}
	r.Route, r.Backend, r.Decision, r.Status = "/v1/chat/completions", "gpu-1", "affinity", 200
	r.BytesIn, r.BytesOut, r.TTFB, r.Duration = int64(len(body)), 42, 3*time.Millisecond, 10*time.Millisecond
	r.SetModel(info.Model)
	r.SetTenant([]byte("tenant-a"))
	r.SetChain(&info, body)
	r.PromptTokens, r.CompletionTokens = prompt, completion
}

// TestRecordRoundTrip writes a recording and parses it back with
// loadtest/trace at BlockTokens: requests sharing a prefix share their
// leading hash ids, as many as the blocks they share.
func TestRecordRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec.jsonl")
	reg := prometheus.NewRegistry()
	var access testkit.Buffer
	l, err := New(Config{AccessSample: 1, AccessFormat: FormatJSON, AccessLog: Stdout, Stdout: &access,
		RecordPath: path, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	shared := strings.Repeat("You are a helpful assistant. ", 200) // 5,800 bytes: 5 full blocks plus
	bodies := [][]byte{
		chatBody(shared, "first question"),
		chatBody(shared, "second question, a longer one "+strings.Repeat("x", 3000)),
		chatBody("other", " prompt"),
		chatBody(strings.Repeat("long ", 20000), ""), // 100,000 bytes: past the chain
	}
	usage := [][2]int64{{1500, 7}, {-1, -1}, {3, 1}, {-1, -1}}
	t0 := time.Now()
	for i, b := range bodies {
		r := l.Begin(t0.Add(time.Duration(i) * 250 * time.Millisecond))
		if r == nil {
			t.Fatal("no record")
		}
		fill(t, r, b, usage[i][0], usage[i][1])
		l.Submit(r)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Close() // twice is fine

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := trace.Parse(f, trace.ParseConfig{BlockTokens: BlockTokens})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(bodies) {
		t.Fatalf("%d records, want %d", len(recs), len(bodies))
	}
	for i, r := range recs {
		if want := time.Duration(i) * 250 * time.Millisecond; r.Timestamp != want {
			t.Errorf("record %d at %v, want %v", i, r.Timestamp, want)
		}
	}
	if recs[0].InputLength != 1500 || recs[0].OutputLength != 7 || len(recs[0].HashIDs) != 5 {
		t.Errorf("record 0: %d in, %d out, %d ids; want 1500, 7, 5", recs[0].InputLength, recs[0].OutputLength, len(recs[0].HashIDs))
	}
	// Estimated from the text: 8,800-odd bytes, 4 bytes a token.
	if in := recs[1].InputLength; in < 8800/4 || in > 9000/4 {
		t.Errorf("record 1: input_length %d, want about %d", in, 8850/4)
	}
	if recs[1].OutputLength != 0 {
		t.Errorf("record 1: output_length %d without usage, want 0", recs[1].OutputLength)
	}
	n := 0
	for n < len(recs[0].HashIDs) && n < len(recs[1].HashIDs) && recs[0].HashIDs[n] == recs[1].HashIDs[n] {
		n++
	}
	if n != 5 {
		t.Errorf("records 0 and 1 share %d leading hash ids, want the 5 full blocks of their shared prefix:\n%v\n%v", n, recs[0].HashIDs, recs[1].HashIDs)
	}
	if len(recs[2].HashIDs) != 0 || recs[2].InputLength != 3 {
		t.Errorf("record 2: %d ids, %d tokens; want 0 and 3", len(recs[2].HashIDs), recs[2].InputLength)
	}
	// 100,000 bytes: 25,000 tokens estimated from the body, 97 ids, the
	// first 64 from the chain.
	if in, ids := recs[3].InputLength, len(recs[3].HashIDs); in < 25000 || in > 25100 || ids != in/BlockTokens {
		t.Errorf("record 3: %d tokens, %d ids; want about 25,000 and one per full block", in, ids)
	}
	for _, r := range recs {
		for _, id := range r.HashIDs {
			if id >= 1<<53 {
				t.Fatalf("hash id %d over 2^53", id)
			}
		}
	}

	lines := strings.Split(strings.TrimSpace(access.String()), "\n")
	if len(lines) != len(bodies) {
		t.Fatalf("%d access lines, want %d:\n%s", len(lines), len(bodies), access.String())
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"route": "/v1/chat/completions", "model": "llama", "backend": "gpu-1",
		"decision": "affinity", "status": 200.0, "bytes_out": 42.0, "ttfb_ms": 3.0, "duration_ms": 10.0} {
		if line[k] != want {
			t.Errorf("access line %s = %v, want %v (%s)", k, line[k], want, lines[0])
		}
	}
	if th, _ := line["tenant"].(string); len(th) != 12 || strings.Contains(lines[0], "tenant-a") {
		t.Errorf("tenant %q: want 12 hex digits, never the tenant", th)
	}
	if got := testutil.ToFloat64(l.written[outTrace]); got != 4 {
		t.Errorf("written trace = %v, want 4", got)
	}
}

// TestRecordBounds: the recording stops at its record limit; the
// previous recording is kept as .1.
func TestRecordBounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	if err := os.WriteFile(path, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{RecordPath: path, RecordMaxRecords: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		r := l.Begin(time.Now())
		if r == nil {
			if i < 3 {
				t.Fatalf("no record %d", i)
			}
			continue
		}
		fill(t, r, chatBody("p", ""), 10, 1)
		l.Submit(r)
	}
	l.Close()
	b, _ := os.ReadFile(path)
	if n := bytes.Count(b, []byte("\n")); n != 3 {
		t.Errorf("%d records written, want 3", n)
	}
	if old, _ := os.ReadFile(path + ".1"); string(old) != "old\n" {
		t.Errorf("previous recording %q, want it kept", old)
	}
}

// TestQueueFull: with every record in use, Begin returns nil at once and
// counts the drop.
func TestQueueFull(t *testing.T) {
	l, err := New(Config{AccessSample: 1, AccessFormat: FormatText, AccessLog: Stdout, Stdout: &testkit.Buffer{}, QueueLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, b := l.Begin(time.Now()), l.Begin(time.Now())
	if a == nil || b == nil {
		t.Fatal("records missing")
	}
	if c := l.Begin(time.Now()); c != nil {
		t.Fatal("a third record from a queue of 2")
	}
	if got := testutil.ToFloat64(l.dropped[outAccess]); got != 1 {
		t.Errorf("dropped %v, want 1", got)
	}
	l.Submit(a)
	l.Submit(b)
}

// TestSampling: about the sampled share of requests get a record.
func TestSampling(t *testing.T) {
	l, err := New(Config{AccessSample: 0.1, AccessFormat: FormatText, AccessLog: Stdout, Stdout: &testkit.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := 0
	for range 10000 {
		if r := l.Begin(time.Now()); r != nil {
			n++
			l.Submit(r)
		}
	}
	if n < 800 || n > 1200 {
		t.Errorf("%d of 10,000 sampled at 0.1", n)
	}
	if off, _ := New(Config{}); off != nil || off.Begin(time.Now()) != nil {
		t.Error("a zero Config writes something")
	}
}

func TestTextLine(t *testing.T) {
	var r Record
	r.reset(time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), true, false)
	r.Route, r.Status, r.BytesIn = "/v1/models", 404, 0
	r.SetModel([]byte(`a "quoted" model`))
	got := string(appendText(nil, &r))
	want := `time=2026-12-01T20:00:00.000000Z route=/v1/models model="a \"quoted\" model" tenant= backend="" decision="" status=404 bytes_in=0 bytes_out=0 ttfb_ms=- duration_ms=0.000` + "\n"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	j := appendJSON(nil, &r)
	if !json.Valid(j) {
		t.Errorf("invalid JSON line %s", j)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{AccessSample: 2},
		{AccessSample: -1},
		{AccessSample: 1, AccessFormat: "xml", AccessLog: Stdout},
		{AccessSample: 1, AccessFormat: FormatJSON},
		{RecordPath: "x", RecordMaxBytes: -1},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v validates", c)
		}
	}
}

func TestCompletionScan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{`{"usage":{"prompt_tokens":5,"completion_tokens":12,"total_tokens":17}}`, 12},
		{`{"usage":{"completion_tokens" : 12 }}`, 12},
		{"data: {\"usage\":{\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"completion_tokens\":30}}\n\n", 30},
		{`{"content":"\"completion_tokens\":99,"}`, -1},
		{`{"completion_tokens":1234567890}`, -1},
		{`{"completion_tokens":012}`, -1},
		{`{"completion_tokens":"12"}`, -1},
		{`{"completion_tokens":0}`, 0},
		{`""completion_tokens":4}`, 4},
	} {
		var c CompletionScan
		c.Feed([]byte(tc.in))
		if got := c.Tokens(); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.in, got, tc.want)
		}
		for cut := range len(tc.in) {
			var c CompletionScan
			c.Feed([]byte(tc.in[:cut]))
			c.Feed([]byte(tc.in[cut:]))
			if got := c.Tokens(); got != tc.want {
				t.Errorf("%s cut at %d: %d, want %d", tc.in, cut, got, tc.want)
			}
		}
	}
}

// FuzzCompletionScan: any answer, in any two pieces, gives the count the
// whole gives, within bounds.
func FuzzCompletionScan(f *testing.F) {
	f.Add([]byte(`{"usage":{"completion_tokens":12}}`), 5)
	f.Add([]byte("data: {\"completion_tokens\": 3}\n\n"), 20)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		var whole, split CompletionScan
		whole.Feed(b)
		if cut < 0 || cut > len(b) {
			cut = len(b) / 2
		}
		split.Feed(b[:cut])
		split.Feed(b[cut:])
		if whole.Tokens() != split.Tokens() {
			t.Fatalf("whole %d, split at %d %d", whole.Tokens(), cut, split.Tokens())
		}
		if n := whole.Tokens(); n < -1 || n >= 1e9 {
			t.Fatalf("count %d out of bounds", n)
		}
	})
}

// BenchmarkRecord is the request path's part (Begin, fill, Submit) with
// the writer formatting JSON lines to a buffer on its own goroutine.
func BenchmarkRecord(b *testing.B) {
	l, err := New(Config{AccessSample: 1, AccessFormat: FormatJSON, AccessLog: Stdout, Stdout: discard{}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	model, tenant := []byte("meta-llama/Llama-3.1-8B-Instruct"), []byte("tenant-a")
	dropped := 0
	b.ReportAllocs()
	for b.Loop() {
		r := l.Begin(time.Now())
		if r == nil {
			dropped++
			continue
		}
		r.Route, r.Backend, r.Decision, r.Status = "/v1/chat/completions", "gpu-1", "affinity", 200
		r.SetModel(model)
		r.SetTenant(tenant)
		r.BytesIn, r.BytesOut, r.TTFB, r.Duration = 4096, 300, time.Millisecond, 2*time.Millisecond
		l.Submit(r)
	}
	b.ReportMetric(float64(dropped)/float64(b.N), "dropped/op")
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkFormat is the writer's part for one request: a JSON access
// line, a text one, and a trace record of a 4 KiB prompt (4 hash ids).
func BenchmarkFormat(b *testing.B) {
	var r Record
	r.reset(time.Now(), true, true)
	r.Route, r.Backend, r.Decision, r.Status = "/v1/chat/completions", "gpu-1", "affinity", 200
	r.SetModel([]byte("meta-llama/Llama-3.1-8B-Instruct"))
	r.SetTenant([]byte("tenant-a"))
	r.BytesIn, r.BytesOut, r.TTFB, r.Duration = 4096, 300, time.Millisecond, 2*time.Millisecond
	r.PromptTokens, r.CompletionTokens, r.Blocks = 1100, 20, 4
	var buf []byte
	for _, f := range []struct {
		name string
		fn   func([]byte, *Record) []byte
	}{
		{"json", appendJSON}, {"text", appendText},
		{"trace", func(b []byte, r *Record) []byte { return AppendTrace(b, r, time.Second) }},
	} {
		b.Run(f.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf = f.fn(buf[:0], &r)
			}
		})
	}
}

// TestLongPromptIDs: past the chain's 64 KiB, ids are the same for the
// same prompt and differ for prompts that only open alike.
func TestLongPromptIDs(t *testing.T) {
	open := strings.Repeat("a long shared opening ", 4000) // 88,000 bytes
	ids := func(body []byte) []int64 {
		var r Record
		r.reset(time.Now(), false, true)
		fill(t, &r, body, -1, -1)
		out := make([]int64, r.HashIDs())
		for k := range out {
			out[k] = r.HashID(k)
		}
		return out
	}
	a, a2, b := ids(chatBody(open, "ending one")), ids(chatBody(open, "ending one")), ids(chatBody(open, "ending two"))
	if len(a) <= ring.MaxChainBlocks || len(a) != len(b) {
		t.Fatalf("%d and %d ids, want the same number, over %d", len(a), len(b), ring.MaxChainBlocks)
	}
	if fmt.Sprint(a) != fmt.Sprint(a2) {
		t.Error("the same prompt, different ids")
	}
	for k := range a {
		if shared := a[k] == b[k]; shared != (k < ring.MaxChainBlocks) {
			t.Errorf("id %d shared %v", k, shared)
		}
	}
}
