package gpusim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
)

func TestRepeatedPromptIsCachedAndFaster(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Overhead = 5 * time.Millisecond
	cfg.PrefillTokensPerSec = 4000 // 2,000 uncached tokens take 500 ms
	cfg.ITLBase = time.Millisecond
	ts := startInstance(t, cfg)

	body := chatBody(words("policy", 8000), `,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}`)
	first := ts.stream(t, t.Context(), "/v1/chat/completions", body)
	second := ts.stream(t, t.Context(), "/v1/chat/completions", body)
	for i, r := range []streamResult{first, second} {
		if !r.done || r.usage == nil || r.usage.CompletionTokens != 4 || r.finish != "length" {
			t.Fatalf("run %d: done %v usage %+v finish %q", i, r.done, r.usage, r.finish)
		}
	}
	if first.usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first run cached %d tokens, want 0", first.usage.PromptTokensDetails.CachedTokens)
	}
	p := second.usage.PromptTokens
	wantCached := (p - 1) / 16 * 16
	if got := second.usage.PromptTokensDetails.CachedTokens; got != wantCached || got == 0 {
		t.Fatalf("second run cached %d of %d tokens, want %d", got, p, wantCached)
	}
	// Modelled: ~505 ms then ~5 ms. The first run's TTFT cannot be below its
	// modelled prefill time; the second must beat it.
	if first.ttft < 400*time.Millisecond {
		t.Fatalf("first TTFT %v is below the modelled ~505 ms", first.ttft)
	}
	if second.ttft >= first.ttft {
		t.Fatalf("cached TTFT %v not lower than uncached %v", second.ttft, first.ttft)
	}
	if first.text != second.text || first.text == "" {
		t.Fatalf("same prompt must give the same filler text: %q vs %q", first.text, second.text)
	}
	st := ts.in.Stats()
	if st.CachedTokens != uint64(wantCached) || st.PrefixCacheQueries != uint64(2*p) || st.Completed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSharedPrefixGetsExactlySharedFullBlocks(t *testing.T) {
	ts := startInstance(t, FastConfig())
	const path = "/v1/completions"
	// Token-id prompts: exact token counts, block size 16.
	a := seqIDs(0, 100)
	ts.postJSON(t, path, tokenIDsBody(a, `,"max_tokens":2`))

	b := append(seqIDs(0, 50), seqIDs(1000, 50)...) // shares 50 tokens: 3 full blocks
	if got := ts.postJSON(t, path, tokenIDsBody(b, `,"max_tokens":2`)).Usage.PromptTokensDetails.CachedTokens; got != 48 {
		t.Fatalf("50 shared tokens: cached %d, want 48", got)
	}
	c := append(seqIDs(0, 64), seqIDs(2000, 10)...) // shares exactly 4 blocks
	if got := ts.postJSON(t, path, tokenIDsBody(c, `,"max_tokens":2`)).Usage.PromptTokensDetails.CachedTokens; got != 64 {
		t.Fatalf("64 shared tokens: cached %d, want 64", got)
	}
	// A fully cached prompt still computes its last token: 32 tokens cached
	// as 16 (the block holding the last token is recomputed), 33 as 32.
	ts.postJSON(t, path, tokenIDsBody(seqIDs(5000, 33), `,"max_tokens":2`))
	if got := ts.postJSON(t, path, tokenIDsBody(seqIDs(5000, 32), `,"max_tokens":2`)).Usage.PromptTokensDetails.CachedTokens; got != 16 {
		t.Fatalf("fully cached 32-token prompt: cached %d, want 16", got)
	}
	if got := ts.postJSON(t, path, tokenIDsBody(seqIDs(5000, 33), `,"max_tokens":2`)).Usage.PromptTokensDetails.CachedTokens; got != 32 {
		t.Fatalf("fully cached 33-token prompt: cached %d, want 32", got)
	}

	// Text prompts: 4 bytes per token, so 300 shared bytes = 75 tokens =
	// 4 full blocks.
	base := words("doc", 300)
	ts.postJSON(t, path, `{"prompt":"`+base+words("A", 200)+`","max_tokens":1}`)
	if got := ts.postJSON(t, path, `{"prompt":"`+base+words("B", 200)+`","max_tokens":1}`).Usage.PromptTokensDetails.CachedTokens; got != 64 {
		t.Fatalf("300 shared bytes: cached %d, want 64", got)
	}
	// A different cache_salt shares nothing.
	if got := ts.postJSON(t, path, `{"prompt":"`+base+words("A", 200)+`","max_tokens":1,"cache_salt":"t2"}`).Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("other cache_salt: cached %d, want 0", got)
	}
}

func TestChatMessagesShareTheirPrefix(t *testing.T) {
	ts := startInstance(t, FastConfig())
	sys := words("system policy", 2000)
	turn := func(user string) string {
		b, _ := json.Marshal([]map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": user}})
		return `{"messages":` + string(b) + `,"max_tokens":1}`
	}
	ts.postJSON(t, "/v1/chat/completions", turn("first question"))
	got := ts.postJSON(t, "/v1/chat/completions", turn("another question")).Usage.PromptTokensDetails.CachedTokens
	// "<|system|>\n" + 2000 bytes = 2011 bytes of shared prefix: 502 whole
	// tokens, 31 full blocks.
	if got != 31*16 {
		t.Fatalf("shared system prompt: cached %d, want %d", got, 31*16)
	}
}

func TestEvictionUnderSmallCapacity(t *testing.T) {
	cfg := FastConfig()
	cfg.KVCacheBlocks = 20
	ts := startInstance(t, cfg)
	const path = "/v1/completions"
	a := tokenIDsBody(seqIDs(0, 160), `,"max_tokens":16`)     // 10 prompt blocks + 1
	b := tokenIDsBody(seqIDs(10000, 288), `,"max_tokens":16`) // 18 prompt blocks + 1

	ts.postJSON(t, path, a)
	if got := ts.postJSON(t, path, a).Usage.PromptTokensDetails.CachedTokens; got != 144 {
		t.Fatalf("A again: cached %d, want 144 (9 blocks; the last is recomputed)", got)
	}
	ts.postJSON(t, path, b) // needs 19 of 20 blocks: evicts most of A
	st := ts.in.Stats()
	if st.KVEvictions == 0 || st.KVBlocksCached > cfg.KVCacheBlocks {
		t.Fatalf("after B: %+v, want evictions and at most %d cached blocks", st, cfg.KVCacheBlocks)
	}
	got := ts.postJSON(t, path, a).Usage.PromptTokensDetails.CachedTokens
	if got >= 144 {
		t.Fatalf("A after eviction: cached %d, want fewer than 144", got)
	}
	if got != 16 {
		// A's blocks were freed last-first, so only its first block (the
		// last evicted) can have survived B's 19-block allocation.
		t.Fatalf("A after eviction: cached %d, want 16", got)
	}
}

func TestKVAdmissionCheckQueuesAndRejects(t *testing.T) {
	cfg := FastConfig()
	cfg.KVCacheBlocks = 15
	cfg.ITLBase = 20 * time.Millisecond
	ts := startInstance(t, cfg)
	// Too big for the whole cache: rejected at once.
	resp, b := ts.do(t, http.MethodPost, "/v1/completions", tokenIDsBody(seqIDs(0, 300), `,"max_tokens":1`))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "KV-cache blocks") {
		t.Fatalf("oversized request: %d %s", resp.StatusCode, b)
	}
	// Two requests of 10 blocks each: the second waits the ~2 s the first
	// takes.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+"/v1/completions",
				strings.NewReader(tokenIDsBody(seqIDs(i*1000, 60), `,"max_tokens":100`)))
			if resp, err := ts.c.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testkit.WaitFor(t, 20*time.Second, "one running and one waiting for KV blocks", func() bool {
		st := ts.in.Stats()
		return st.Running == 1 && st.Waiting == 1
	})
	if st := ts.in.Stats(); st.KVCacheUsage > 1 || st.KVBlocksUsed > 15 {
		t.Fatalf("usage over capacity: %+v", st)
	}
	testkit.WaitFor(t, 20*time.Second, "both complete", func() bool { return ts.in.Stats().Completed == 2 })
	wg.Wait()
}

func TestRequestsBeyondMaxNumSeqsWait(t *testing.T) {
	cfg := FastConfig()
	cfg.MaxNumSeqs = 2
	cfg.ITLBase = 50 * time.Millisecond
	ts := startInstance(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+"/v1/chat/completions",
				strings.NewReader(chatBody(words("q", 100+i), `,"max_tokens":1000,"stream":true`)))
			if resp, err := ts.c.Do(req); err == nil {
				_, _ = resp.Body.Read(make([]byte, 1))
				<-ctx.Done()
				resp.Body.Close()
			}
		}()
	}
	testkit.WaitFor(t, 20*time.Second, "2 running and 3 waiting", func() bool {
		st := ts.in.Stats()
		return st.Running == 2 && st.Waiting == 3
	})
	fams := scrape(t, ts)
	if v := gaugeValue(t, fams, "vllm:num_requests_waiting"); v != 3 {
		t.Fatalf("vllm:num_requests_waiting = %v, want 3", v)
	}
	if v := gaugeValue(t, fams, "vllm:num_requests_running"); v != 2 {
		t.Fatalf("vllm:num_requests_running = %v, want 2", v)
	}
	cancel()
	wg.Wait()
	testkit.WaitFor(t, 20*time.Second, "all aborted", func() bool {
		st := ts.in.Stats()
		return st.Aborted == 5 && st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0
	})
}

func TestConcurrentPrefillsShareThroughput(t *testing.T) {
	cfg := FastConfig()
	cfg.PrefillTokensPerSec = 1000 // one 1,000-token prefill alone: 1 s
	cfg.KVCacheBlocks = 140
	ts := startInstance(t, cfg)
	// A blocker holds 130 of the 140 KV blocks, so A and B (63 blocks each)
	// queue behind it; aborting it admits both in the same instant.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	blocked := make(chan struct{})
	go func() {
		defer close(blocked)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+"/v1/completions",
			strings.NewReader(tokenIDsBody(seqIDs(50000, 2000), `,"max_tokens":80`)))
		if resp, err := ts.c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testkit.WaitFor(t, 20*time.Second, "the blocker running", func() bool { return ts.in.Stats().Running == 1 })
	var wg sync.WaitGroup
	first := make([]time.Time, 2)
	for i := range first {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := ts.stream(t, t.Context(), "/v1/completions", tokenIDsBody(seqIDs(i*10000, 1000), `,"max_tokens":1,"stream":true`))
			first[i] = r.firstAt
		}()
	}
	testkit.WaitFor(t, 20*time.Second, "A and B waiting", func() bool { return ts.in.Stats().Waiting == 2 })
	t0 := time.Now()
	cancel()
	<-blocked
	wg.Wait()
	// Sharing 1,000 tokens/s, both finish 2 s after admission; served one
	// after the other, one would finish after 1 s.
	for i, at := range first {
		if d := at.Sub(t0); d < 1600*time.Millisecond {
			t.Fatalf("request %d got its first token %v after admission: concurrent prefills did not share throughput", i, d)
		}
	}
}

func TestClientDisconnectAbortsGeneration(t *testing.T) {
	cfg := FastConfig()
	cfg.ITLBase = 10 * time.Millisecond
	ts := startInstance(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+"/v1/chat/completions",
		strings.NewReader(chatBody("tell me everything", `,"max_tokens":100000,"stream":true`)))
	resp, err := ts.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("reading first chunk: %v", err)
	}
	testkit.WaitFor(t, 20*time.Second, "the request running", func() bool { return ts.in.Stats().Running == 1 })
	cancel()
	resp.Body.Close()
	testkit.WaitFor(t, 20*time.Second, "the abort", func() bool {
		st := ts.in.Stats()
		return st.Aborted == 1 && st.Running == 0 && st.KVBlocksUsed == 0
	})
	gen := ts.in.Stats().GenerationTokens
	time.Sleep(50 * time.Millisecond) // five decode steps: none may add tokens
	st := ts.in.Stats()
	if st.GenerationTokens != gen || st.Completed != 0 {
		t.Fatalf("generation went on after the abort: %d -> %d tokens, %d completed", gen, st.GenerationTokens, st.Completed)
	}
	fams := scrape(t, ts)
	if v := counterValue(t, fams, "gpusim_requests_aborted_total", nil); v != 1 {
		t.Fatalf("gpusim_requests_aborted_total = %v, want 1", v)
	}
	for _, reason := range []string{"stop", "length", "abort"} {
		if v := counterValue(t, fams, "vllm:request_success_total", map[string]string{"finished_reason": reason}); v != 0 {
			t.Fatalf("vllm:request_success_total{finished_reason=%q} = %v, want 0", reason, v)
		}
	}
	var stats Stats
	_, b := ts.do(t, http.MethodGet, "/admin/stats", "")
	if err := json.Unmarshal(b, &stats); err != nil || stats.Aborted != 1 || stats.Name != "gpu-0" {
		t.Fatalf("/admin/stats %s: %v", b, err)
	}
}

func TestFaults(t *testing.T) {
	ts := startInstance(t, FastConfig())
	body := chatBody("hello", `,"max_tokens":2`)
	if err := ts.in.SetFaults(Faults{FailFraction: 1}); err != nil {
		t.Fatal(err)
	}
	resp, b := ts.do(t, http.MethodPost, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("fail fraction 1: status %d", resp.StatusCode)
	}
	checkErrorBody(t, b, 500, "InternalServerError")

	// Flip through the admin endpoint: stall every request 300 ms.
	resp, b = ts.do(t, http.MethodPost, "/admin/faults", `{"fail_fraction":0,"stall_fraction":1,"stall_seconds":0.3}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"stall_seconds":0.3`) {
		t.Fatalf("POST /admin/faults: %d %s", resp.StatusCode, b)
	}
	start := time.Now()
	ts.postJSON(t, "/v1/chat/completions", body)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("stalled request answered after %v, want >= 300ms", d)
	}
	if _, b := ts.do(t, http.MethodPost, "/admin/faults", `{"stall_fraction":0}`); !strings.Contains(string(b), `"stall_fraction":0`) {
		t.Fatalf("reset faults: %s", b)
	}
	ts.postJSON(t, "/v1/chat/completions", body)
	st := ts.in.Stats()
	if st.Failed != 1 || st.Stalled != 1 || st.Completed != 2 {
		t.Fatalf("stats %+v, want 1 failed, 1 stalled, 2 completed", st)
	}
	for _, bad := range []string{`{"fail_fraction":2}`, `{"stall_seconds":-1}`, `{"nope":1}`, `{`} {
		if resp, _ := ts.do(t, http.MethodPost, "/admin/faults", bad); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("POST /admin/faults %s: status %d, want 400", bad, resp.StatusCode)
		}
	}
}

func checkErrorBody(t *testing.T, b []byte, code int, typ string) errorBody {
	t.Helper()
	var e errorBody
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("error body %s: %v", b, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("error body %s lacks error.%s", b, k)
		}
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != code || e.Error.Type != typ || e.Error.Message == "" {
		t.Fatalf("error body %s: want code %d type %q", b, code, typ)
	}
	return e
}

func TestBadInput(t *testing.T) {
	ts := startInstance(t, FastConfig())
	cases := []struct {
		method, path, body string
		status             int
		typ                string
		message            string
	}{
		{"POST", "/v1/chat/completions", `{"messages":[`, 400, "Bad Request", ""},
		{"POST", "/v1/chat/completions", `{"model":"meta-llama/Llama-3.1-70B-Instruct"}`, 400, "Bad Request", "messages"},
		{"POST", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "Bad Request", "role"},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":42}]}`, 400, "Bad Request", ""},
		{"POST", "/v1/completions", `{"max_tokens":3}`, 400, "Bad Request", "prompt"},
		{"POST", "/v1/completions", `{"prompt":""}`, 400, "BadRequestError", "empty"},
		{"POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError", "at least 1"},
		{"POST", "/v1/completions", `{"prompt":"x","n":2}`, 400, "BadRequestError", "n=1"},
		{"POST", "/v1/completions", `{"prompt":["a","b"]}`, 400, "BadRequestError", "one prompt"},
		{"POST", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream=True"},
		{"POST", "/v1/completions", `{"prompt":"x","max_tokens":200000}`, 400, "BadRequestError", "maximum context length"},
		{"POST", "/v1/chat/completions", chatBody("hi", "")[:0] + `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
			404, "NotFoundError", "The model `gpt-4o` does not exist."},
		{"POST", "/invocations", `{"inputs":"hi"}`, 400, "BadRequestError", "Cannot find suitable handler"},
		{"GET", "/v1/chat/completions", "", 405, "Method Not Allowed", "Method Not Allowed"},
		{"POST", "/v1/models", "", 405, "Method Not Allowed", ""},
		{"DELETE", "/ping", "", 405, "Method Not Allowed", ""},
		{"GET", "/v2/nothing", "", 404, "Not Found", ""},
	}
	for _, c := range cases {
		resp, b := ts.do(t, c.method, c.path, c.body)
		if resp.StatusCode != c.status {
			t.Errorf("%s %s %s: status %d, want %d (%s)", c.method, c.path, c.body, resp.StatusCode, c.status, b)
			continue
		}
		if resp.Header.Get("X-Gpusim-Instance") != "gpu-0" {
			t.Errorf("%s %s: no X-Gpusim-Instance header", c.method, c.path)
		}
		e := checkErrorBody(t, b, c.status, c.typ)
		if !strings.Contains(e.Error.Message, c.message) {
			t.Errorf("%s %s %s: message %q, want it to contain %q", c.method, c.path, c.body, e.Error.Message, c.message)
		}
		if c.status == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
	}
	if st := ts.in.Stats(); st.Completed != 0 || st.Running != 0 || st.PrefixCacheQueries != 0 {
		t.Fatalf("rejected requests reached the engine: %+v", st)
	}
}

func TestSageMakerAndHealthEndpoints(t *testing.T) {
	ts := startInstance(t, FastConfig())
	for _, p := range []string{"/ping", "/health"} {
		resp, b := ts.do(t, http.MethodGet, p, "")
		if resp.StatusCode != http.StatusOK || len(b) != 0 {
			t.Fatalf("GET %s: %d %q, want 200 and an empty body", p, resp.StatusCode, b)
		}
	}
	chat := ts.postJSON(t, "/invocations", chatBody("hello there", `,"max_tokens":3`))
	if chat.Object != "chat.completion" || chat.Choices[0].Message.Role != "assistant" || chat.Choices[0].Message.Content == "" {
		t.Fatalf("invocations with messages: %+v", chat)
	}
	cmpl := ts.postJSON(t, "/invocations", `{"prompt":"hello there","max_tokens":3}`)
	if cmpl.Object != "text_completion" || cmpl.Choices[0].Text == "" || cmpl.Usage.CompletionTokens != 3 {
		t.Fatalf("invocations with prompt: %+v", cmpl)
	}
	r := ts.stream(t, t.Context(), "/invocations", `{"prompt":"hello there","max_tokens":3,"stream":true}`)
	if !r.done || r.finish != "length" || r.instance != "gpu-0" {
		t.Fatalf("streaming invocations: %+v", r)
	}
	resp, b := ts.do(t, http.MethodGet, "/v1/models", "")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &models); err != nil || resp.StatusCode != 200 || models.Object != "list" ||
		len(models.Data) != 1 || models.Data[0].ID != "meta-llama/Llama-3.1-70B-Instruct" {
		t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, b)
	}
}

func TestDefaultAndExplicitOutputLength(t *testing.T) {
	cfg := FastConfig()
	cfg.DefaultMaxTokens = 7
	ts := startInstance(t, cfg)
	c := ts.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if c.Usage.CompletionTokens != 7 || *c.Choices[0].FinishReason != "stop" {
		t.Fatalf("no max_tokens: %d tokens, finish %q; want 7 and stop", c.Usage.CompletionTokens, *c.Choices[0].FinishReason)
	}
	c = ts.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":50,"max_completion_tokens":3}`)
	if c.Usage.CompletionTokens != 3 || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("max_completion_tokens 3: %d tokens, finish %q", c.Usage.CompletionTokens, *c.Choices[0].FinishReason)
	}
	if n := len(strings.Fields(c.Choices[0].Message.Content)); n != 3 {
		t.Fatalf("content %q has %d words, want one per token", c.Choices[0].Message.Content, n)
	}
	if c.Usage.TotalTokens != c.Usage.PromptTokens+3 {
		t.Fatalf("usage %+v: total != prompt + completion", c.Usage)
	}
	// Chat content parts are joined; the model field may be absent.
	c = ts.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}],"max_tokens":1}`)
	if want := (len("<|user|>\na\nb<|eot|>\n<|assistant|>\n") + 3) / 4; c.Usage.PromptTokens != want {
		t.Fatalf("content parts: %d prompt tokens, want %d", c.Usage.PromptTokens, want)
	}
}

func TestTimeScaleShortensEveryDuration(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Overhead = 100 * time.Second
	cfg.ITLBase = 10 * time.Second
	cfg.PrefillTokensPerSec = 10 // 100 tokens: 10 s
	cfg.TimeScale = 1e-4         // all of it: ~15 ms
	ts := startInstance(t, cfg)
	start := time.Now()
	ts.postJSON(t, "/v1/completions", tokenIDsBody(seqIDs(0, 100), `,"max_tokens":5`))
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("scaled request took %v; unscaled it takes 150 s, scaled ~15 ms", d)
	}
}

func TestCloseAbortsInFlightRequests(t *testing.T) {
	in, err := New(FastConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := newServerFor(t, in)
	done := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Post(srv.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"x","max_tokens":100000}`))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	testkit.WaitFor(t, 20*time.Second, "the request running", func() bool { return in.Stats().Running == 1 })
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("a request cut short by Close got an answer; want the connection dropped")
	}
	if err := in.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := in.ResetPrefixCache(); err == nil {
		t.Fatal("ResetPrefixCache after Close must fail")
	}
	resp, err := srv.Client().Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/health after Close: %d, want 503", resp.StatusCode)
	}
}

func TestResetPrefixCacheEndpoint(t *testing.T) {
	ts := startInstance(t, FastConfig())
	body := tokenIDsBody(seqIDs(0, 100), `,"max_tokens":1`)
	ts.postJSON(t, "/v1/completions", body)
	resp, b := ts.do(t, http.MethodPost, "/reset_prefix_cache", "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"evicted_blocks":6`) {
		t.Fatalf("reset: %d %s", resp.StatusCode, b)
	}
	if got := ts.postJSON(t, "/v1/completions", body).Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("after reset: cached %d, want 0", got)
	}
}

func TestStreamIntervalBatchesTokens(t *testing.T) {
	cfg := FastConfig()
	cfg.StreamInterval = 4
	cfg.ITLBase = 5 * time.Millisecond
	ts := startInstance(t, cfg)
	r := ts.stream(t, t.Context(), "/v1/chat/completions", chatBody("count", `,"max_tokens":10,"stream":true`))
	want := ts.postJSON(t, "/v1/chat/completions", chatBody("count", `,"max_tokens":10`)).Choices[0].Message.Content
	if r.text != want || r.finish != "length" {
		t.Fatalf("streamed %q (%s), want %q", r.text, r.finish, want)
	}
	var contents []string
	for _, c := range r.chunks {
		if len(c.Choices) == 1 && c.Choices[0].Delta.Content != "" {
			contents = append(contents, c.Choices[0].Delta.Content)
		}
	}
	// Tokens 1, 2-5, 6-9, 10 at most; only pile-ups merge chunks further.
	if len(contents) > 4 {
		t.Fatalf("%d content chunks for 10 tokens at interval 4: %q", len(contents), contents)
	}
	for i, c := range contents[1 : len(contents)-1] {
		if n := len(strings.Fields(c)); n < 4 {
			t.Fatalf("chunk %d has %d tokens, want at least 4: %q", i+1, n, contents)
		}
	}
}

func TestPrefillTokenBudgetQueuesPrefills(t *testing.T) {
	cfg := FastConfig()
	cfg.PrefillTokensPerSec = 500 // 1,000 tokens: 2 s
	cfg.MaxNumBatchedTokens = 1500
	ts := startInstance(t, cfg)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts.postJSON(t, "/v1/completions", tokenIDsBody(seqIDs(i*10000, 1000), `,"max_tokens":1`))
		}()
	}
	testkit.WaitFor(t, 20*time.Second, "one prefilling and one waiting for the token budget", func() bool {
		st := ts.in.Stats()
		return st.Running == 1 && st.Waiting == 1
	})
	wg.Wait()
}

func TestPrefillCachesBlocksAsItGoes(t *testing.T) {
	cfg := FastConfig()
	cfg.PrefillTokensPerSec = 1000 // 2,000 tokens: 2 s
	ts := startInstance(t, cfg)
	body := tokenIDsBody(seqIDs(0, 2000), `,"max_tokens":1`)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ts.postJSON(t, "/v1/completions", body)
	}()
	testkit.WaitFor(t, 20*time.Second, "the first request prefilling", func() bool { return ts.in.Stats().Running == 1 })
	time.Sleep(500 * time.Millisecond) // at 1,000 tokens/s: >= 500 tokens computed
	got := ts.postJSON(t, "/v1/completions", body).Usage.PromptTokensDetails.CachedTokens
	if got < 496 {
		t.Fatalf("request arriving mid-prefill cached %d tokens, want >= 496 (31 blocks computed)", got)
	}
	<-done
}

// TestInterTokenLatencyGrowsWithRunningRequests: a decode step lasts
// ITLBase + ITLPerSeq x running, so streams decoding together get their
// tokens further apart than a stream alone; with ITLPerSeq 0 they do not.
func TestInterTokenLatencyGrowsWithRunningRequests(t *testing.T) {
	const tokens, together = 30, 12
	meanITL := func(ts *testServer, n int) time.Duration {
		var wg sync.WaitGroup
		itl := make([]time.Duration, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := ts.stream(t, t.Context(), "/v1/completions",
					tokenIDsBody(seqIDs(i*1000+n*100000, 64), fmt.Sprintf(`,"max_tokens":%d,"stream":true`, tokens)))
				itl[i] = time.Since(r.firstAt) / (tokens - 1)
			}()
		}
		wg.Wait()
		var sum time.Duration
		for _, d := range itl {
			sum += d
		}
		return sum / time.Duration(n)
	}
	for _, perSeq := range []time.Duration{2 * time.Millisecond, 0} {
		cfg := FastConfig()
		cfg.ITLBase = 2 * time.Millisecond
		cfg.ITLPerSeq = perSeq
		ts := startInstance(t, cfg)
		alone := meanITL(ts, 1)
		loaded := meanITL(ts, together)
		ratio := float64(loaded) / float64(alone)
		t.Logf("ITLPerSeq %v: mean inter-token latency alone %v, %d streams together %v (x%.1f)", perSeq, alone, together, loaded, ratio)
		// Model: alone 2+2 = 4 ms a step, together 2+2x12 = 26 ms (x6.5).
		if perSeq > 0 && ratio < 3 {
			t.Errorf("ITLPerSeq %v: inter-token latency grew only x%.1f with %d running requests", perSeq, ratio, together)
		}
		if perSeq == 0 && ratio > 2 {
			t.Errorf("ITLPerSeq 0: inter-token latency grew x%.1f with %d running requests", ratio, together)
		}
	}
}
