package gpusim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/warmroute/warmroute/internal/testkit"
)

const baseModel = "meta-llama/Llama-3.1-70B-Instruct"

// loraConfig is FastConfig with LoRA enabled and adapters sql and chat
// served from the start.
func loraConfig() Config {
	c := FastConfig()
	c.EnableLoRA = true
	c.LoRAModules = []LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat", BaseModelName: baseModel}}
	c.MaxLoRAs, c.MaxCPULoRAs = 2, 4
	c.LoRALoadTime, c.LoRASwapTime = time.Millisecond, time.Millisecond
	return c
}

func modelBody(model, prompt, extra string) string {
	p, _ := json.Marshal(prompt)
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%s}]%s}`, model, p, extra)
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

func (ts *testServer) models(t *testing.T) []modelCard {
	t.Helper()
	resp, b := ts.do(t, http.MethodGet, "/v1/models", "")
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil || resp.StatusCode != http.StatusOK || list.Object != "list" {
		t.Fatalf("/v1/models: %d %s %v", resp.StatusCode, b, err)
	}
	return list.Data
}

// errorOf decodes a vLLM ErrorResponse.
func errorOf(t *testing.T, b []byte) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == 0 {
		t.Fatalf("not an error response: %s (%v)", b, err)
	}
	return e
}

func TestLoRAModulesListedWithTheirParent(t *testing.T) {
	ts := startInstance(t, loraConfig())
	cards := ts.models(t)
	if len(cards) != 3 {
		t.Fatalf("%d models: %+v", len(cards), cards)
	}
	base := cards[0]
	if base.ID != baseModel || base.Root != baseModel || base.Parent != nil || base.MaxModelLen == nil || *base.MaxModelLen != 131072 {
		t.Fatalf("base model card %+v", base)
	}
	for i, want := range []LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat"}} {
		c := cards[i+1]
		if c.ID != want.Name || c.Root != want.Path || c.Parent == nil || *c.Parent != baseModel ||
			c.MaxModelLen != nil || c.Object != "model" || c.OwnedBy != "vllm" {
			t.Fatalf("adapter card %d: %+v", i, c)
		}
	}
	if got := ts.in.LoRAAdapters(); strings.Join(got, ",") != "sql,chat" {
		t.Fatalf("LoRAAdapters %v", got)
	}
}

func TestLoRARequestsServedUnknownModel404(t *testing.T) {
	ts := startInstance(t, loraConfig())
	for _, model := range []string{"sql", "chat", baseModel, ""} {
		c := ts.postJSON(t, "/v1/chat/completions", modelBody(model, "hello "+model, `,"max_tokens":3`))
		want := model
		if model == "" {
			want = baseModel
		}
		if c.Model != want || c.Usage.CompletionTokens != 3 {
			t.Fatalf("model %q: answered as %q: %+v", model, c.Model, c)
		}
	}
	// Streams, completions and the Responses API name the adapter too.
	r := ts.stream(t, t.Context(), "/v1/completions", `{"model":"sql","prompt":"select","max_tokens":2,"stream":true}`)
	if !r.done || len(r.chunks) == 0 || r.chunks[0].Model != "sql" {
		t.Fatalf("stream: %+v", r)
	}
	resp, b := ts.do(t, http.MethodPost, "/v1/responses", `{"model":"chat","input":"hi","max_output_tokens":2}`)
	var ro struct{ Model string }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &ro) != nil || ro.Model != "chat" {
		t.Fatalf("responses: %d %s", resp.StatusCode, b)
	}
	// So do the endpoints answered without the engine.
	resp, b = ts.do(t, http.MethodPost, "/v1/embeddings", `{"model":"sql","input":"x"}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"model":"sql"`) {
		t.Fatalf("embeddings: %d %s", resp.StatusCode, b)
	}

	// An adapter the instance does not serve is vLLM's 404, on every path.
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize"} {
		body := modelBody("sql-v2", "x", "")
		if path != "/v1/chat/completions" {
			body = `{"model":"sql-v2","prompt":"x","input":"x"}`
		}
		resp, b := ts.do(t, http.MethodPost, path, body)
		e := errorOf(t, b)
		if resp.StatusCode != http.StatusNotFound || e.Error.Type != "NotFoundError" || e.Error.Code != 404 ||
			e.Error.Message != "The model `sql-v2` does not exist." || e.Error.Param == nil || *e.Error.Param != "model" {
			t.Fatalf("%s unknown adapter: %d %s", path, resp.StatusCode, b)
		}
	}
}

func TestLoRAPrefixCacheSeparatedPerAdapter(t *testing.T) {
	ts := startInstance(t, loraConfig())
	prompt := words("a long shared document", 4000)
	cached := func(model string) (int, string) {
		t.Helper()
		c := ts.postJSON(t, "/v1/chat/completions", modelBody(model, prompt, `,"max_tokens":4`))
		return c.Usage.PromptTokensDetails.CachedTokens, c.Choices[0].Message.Content
	}
	first, baseText := cached(baseModel)
	again, _ := cached(baseModel)
	if first != 0 || again == 0 {
		t.Fatalf("base model: cached %d then %d, want 0 then most of the prompt", first, again)
	}
	sql1, sqlText := cached("sql")
	if sql1 != 0 {
		t.Fatalf("adapter sql hit the base model's cache: %d tokens", sql1)
	}
	if sql2, _ := cached("sql"); sql2 != again {
		t.Fatalf("adapter sql again: cached %d, want %d", sql2, again)
	}
	if chat1, chatText := cached("chat"); chat1 != 0 || chatText == sqlText {
		t.Fatalf("adapter chat: cached %d tokens of sql's blocks (want 0), same text as sql: %v", chat1, chatText == sqlText)
	}
	if baseText == sqlText {
		t.Fatal("an adapter answers the same text as the base model")
	}
	// The same salt under two adapters shares nothing either.
	salted := func(model string) int {
		return ts.postJSON(t, "/v1/chat/completions", modelBody(model, prompt, `,"max_tokens":1,"cache_salt":"s"`)).Usage.PromptTokensDetails.CachedTokens
	}
	if a, b := salted("sql"), salted("chat"); a != 0 || b != 0 {
		t.Fatalf("salted under sql then chat: cached %d, %d", a, b)
	}
}

// postLoRA posts a load or unload body with a JSON content type.
func (ts *testServer) postLoRA(t *testing.T, path, body string) (int, string) {
	t.Helper()
	resp, b := ts.do(t, http.MethodPost, path, body)
	return resp.StatusCode, string(b)
}

func TestLoRARuntimeEndpointsGatedAsVLLM(t *testing.T) {
	cfg := loraConfig()
	ts := startInstance(t, cfg)
	for _, path := range []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} {
		code, b := ts.postLoRA(t, path, `{"lora_name":"x","lora_path":"/x"}`)
		if code != http.StatusNotFound || errorOf(t, []byte(b)).Error.Message != "Not Found" {
			t.Fatalf("%s without runtime updating: %d %s", path, code, b)
		}
	}
	if len(ts.models(t)) != 3 {
		t.Fatal("a refused load changed the models")
	}
}

func TestLoRARuntimeLoadAndUnload(t *testing.T) {
	cfg := loraConfig()
	cfg.AllowRuntimeLoRAUpdating = true
	ts := startInstance(t, cfg)
	const load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"

	// Before the load, the adapter is an unknown model.
	if resp, _ := ts.do(t, http.MethodPost, "/v1/chat/completions", modelBody("summarize", "x", "")); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unloaded adapter served: %d", resp.StatusCode)
	}
	loadsBefore := ts.in.Stats().LoRALoads
	code, b := ts.postLoRA(t, load, `{"lora_name":"summarize","lora_path":"/adapters/sum"}`)
	if code != http.StatusOK || b != "Success: LoRA adapter 'summarize' added successfully." {
		t.Fatalf("load: %d %q", code, b)
	}
	if got := ts.in.Stats().LoRALoads; got != loadsBefore+1 {
		t.Fatalf("a load read %d adapters from disk, want 1", got-loadsBefore)
	}
	cards := ts.models(t)
	if last := cards[len(cards)-1]; len(cards) != 4 || last.ID != "summarize" || last.Root != "/adapters/sum" || *last.Parent != baseModel {
		t.Fatalf("models after load: %+v", cards)
	}
	if c := ts.postJSON(t, "/v1/chat/completions", modelBody("summarize", "x", `,"max_tokens":1`)); c.Model != "summarize" {
		t.Fatalf("loaded adapter answered as %q", c.Model)
	}

	for _, tc := range []struct {
		path, body string
		code       int
		typ, msg   string
	}{
		{load, `{"lora_name":"summarize","lora_path":"/adapters/sum2"}`, 400, "InvalidUserInput",
			"The lora adapter 'summarize' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."},
		{load, `{"lora_name":"","lora_path":"/p"}`, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."},
		{load, `{"lora_name":"n","lora_path":""}`, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."},
		{load, `{"lora_path":"/p"}`, 400, "Bad Request", "lora_name: Field required"},
		{load, `{"lora_name":"n"}`, 400, "Bad Request", "lora_path: Field required"},
		{load, `{"lora_name":7,"lora_path":"/p"}`, 400, "Bad Request", ""},
		{load, `not json`, 400, "Bad Request", ""},
		{load, `{"lora_name":"` + strings.Repeat("n", MaxLoRANameBytes+1) + `","lora_path":"/p"}`, 400, "InvalidUserInput", ""},
		{load, `{"lora_name":"bad\u0001name","lora_path":"/p"}`, 400, "InvalidUserInput", ""},
		{load, `{"lora_name":"p","lora_path":"/p\nq"}`, 400, "InvalidUserInput", ""},
		{load, `{"lora_name":"` + baseModel + `","lora_path":"/p"}`, 400, "InvalidUserInput", ""},
		{unload, `{"lora_name":"nope"}`, 404, "NotFoundError", "The lora adapter 'nope' cannot be found."},
		{unload, `{"lora_name":""}`, 400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter."},
		{unload, `{}`, 400, "Bad Request", "lora_name: Field required"},
	} {
		code, b := ts.postLoRA(t, tc.path, tc.body)
		e := errorOf(t, []byte(b))
		if code != tc.code || e.Error.Code != tc.code || e.Error.Type != tc.typ || tc.msg != "" && e.Error.Message != tc.msg {
			t.Errorf("%s %.60s: %d %s, want %d %s %q", tc.path, tc.body, code, b, tc.code, tc.typ, tc.msg)
		}
	}
	// Not JSON by its content type: 415, as vLLM's validate_json_request.
	req, _ := http.NewRequest(http.MethodPost, ts.srv.URL+load, strings.NewReader(`{"lora_name":"a","lora_path":"/a"}`))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := ts.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain load: %d, want 415", resp.StatusCode)
	}
	if len(ts.models(t)) != 4 {
		t.Fatal("a refused load changed the models")
	}

	// In place: same name, new path, same position.
	code, b = ts.postLoRA(t, load, `{"lora_name":"sql","lora_path":"/adapters/sql-v2","load_inplace":true}`)
	if code != http.StatusOK {
		t.Fatalf("load in place: %d %s", code, b)
	}
	if cards := ts.models(t); cards[1].ID != "sql" || cards[1].Root != "/adapters/sql-v2" || len(cards) != 4 {
		t.Fatalf("models after an in-place load: %+v", cards)
	}

	code, b = ts.postLoRA(t, unload, `{"lora_name":"summarize","lora_int_id":3}`)
	if code != http.StatusOK || b != "Success: LoRA adapter 'summarize' removed successfully." {
		t.Fatalf("unload: %d %q", code, b)
	}
	if resp, _ := ts.do(t, http.MethodPost, "/v1/chat/completions", modelBody("summarize", "x", "")); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unloaded adapter still served: %d", resp.StatusCode)
	}
	if cards := ts.models(t); len(cards) != 3 || cards[2].ID != "chat" {
		t.Fatalf("models after unload: %+v", cards)
	}
	if code, _ := ts.postLoRA(t, unload, `{"lora_name":"summarize"}`); code != http.StatusNotFound {
		t.Fatalf("second unload: %d", code)
	}
	if resp, _ := ts.do(t, http.MethodGet, load, ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET load: %d", resp.StatusCode)
	}
}

func TestLoRARuntimeLoadNeedsLoRAEnabled(t *testing.T) {
	cfg := FastConfig()
	cfg.AllowRuntimeLoRAUpdating = true
	ts := startInstance(t, cfg)
	code, b := ts.postLoRA(t, "/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/a"}`)
	if e := errorOf(t, []byte(b)); code != 500 || e.Error.Message != "LoRA is not enabled. Use --enable-lora to enable LoRA." {
		t.Fatalf("load without LoRA: %d %s", code, b)
	}
	fams := scrape(t, ts)
	if fams["vllm:lora_requests_info"] != nil {
		t.Fatal("vllm:lora_requests_info exported without LoRA enabled")
	}
}

func TestLoRAAdaptersBounded(t *testing.T) {
	cfg := loraConfig()
	cfg.LoRAModules = nil
	cfg.AllowRuntimeLoRAUpdating = true
	ts := startInstance(t, cfg)
	for i := 0; i < MaxLoRAAdapters; i++ {
		ts.in.loras.add(newLoRAAdapter(fmt.Sprintf("a%d", i), "/p"))
	}
	code, b := ts.postLoRA(t, "/v1/load_lora_adapter", `{"lora_name":"one-more","lora_path":"/p"}`)
	if e := errorOf(t, []byte(b)); code != 400 || !strings.Contains(e.Error.Message, "at most 1024") {
		t.Fatalf("load past the bound: %d %s", code, b)
	}
	// In place is not one more.
	if code, b := ts.postLoRA(t, "/v1/load_lora_adapter", `{"lora_name":"a5","lora_path":"/q","load_inplace":true}`); code != 200 {
		t.Fatalf("in-place load at the bound: %d %s", code, b)
	}
}

// loraInfoLabels returns vllm:lora_requests_info's labels and value.
func loraInfoLabels(t *testing.T, ts *testServer) (map[string]string, float64) {
	t.Helper()
	f := scrape(t, ts)["vllm:lora_requests_info"]
	if f == nil || f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 1 {
		t.Fatalf("vllm:lora_requests_info: %v", f)
	}
	m := f.GetMetric()[0]
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out, m.GetGauge().GetValue()
}

// TestLoRAMaxLorasPassesOverAndCharges: with one GPU slot, a request for
// a second adapter waits while the first adapter runs, requests behind it
// pass it, and it pays its load when its turn comes. The metric names the
// adapters running and waiting.
func TestLoRAMaxLorasPassesOverAndCharges(t *testing.T) {
	cfg := loraConfig()
	cfg.MaxLoRAs, cfg.MaxCPULoRAs = 1, 1
	cfg.ITLBase = 50 * time.Millisecond // sql's request holds the slot until it is cancelled
	cfg.LoRALoadTime = 100 * time.Millisecond
	cfg.LoRASwapTime = 0
	ts := startInstance(t, cfg)
	before := ts.in.Stats()
	labels, v := loraInfoLabels(t, ts)
	if labels["max_lora"] != "1" || labels["running_lora_adapters"] != "" || labels["waiting_lora_adapters"] != "" || v <= 0 {
		t.Fatalf("idle lora info %v %v", labels, v)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	run := func(ctx context.Context, model, extra string) <-chan string {
		out := make(chan string, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+"/v1/chat/completions", strings.NewReader(modelBody(model, "q "+model, extra)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := ts.c.Do(req)
			if err != nil {
				out <- model + ": " + err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- fmt.Sprintf("%s: %d %.200s", model, resp.StatusCode, b)
		}()
		return out
	}
	// Host memory holds chat (the last of the modules loaded at start),
	// so sql is read from disk, and 10,000 tokens keep it running.
	sqlCtx, cancelSQL := context.WithCancel(t.Context())
	defer cancelSQL()
	run(sqlCtx, "sql", `,"max_tokens":10000`)
	testkit.WaitFor(t, 20*time.Second, "sql running", func() bool { return ts.in.Stats().Running == 1 })
	chat := run(t.Context(), "chat", `,"max_tokens":1`)
	testkit.WaitFor(t, 20*time.Second, "chat waiting", func() bool { return ts.in.Stats().Waiting == 1 })
	labels, _ = loraInfoLabels(t, ts)
	if labels["running_lora_adapters"] != "sql" || labels["waiting_lora_adapters"] != "chat" {
		t.Fatalf("lora info while chat waits: %v", labels)
	}
	// The base model needs no slot: it passes the waiting chat request.
	if c := ts.postJSON(t, "/v1/chat/completions", modelBody(baseModel, "base", `,"max_tokens":1`)); c.Model != baseModel {
		t.Fatalf("base request: %+v", c)
	}
	if st := ts.in.Stats(); st.Waiting != 1 || st.Running != 1 || st.Completed != before.Completed+1 {
		t.Fatalf("after the base request passed: %+v", st)
	}
	// Once sql's request is gone, chat takes the slot.
	cancelSQL()
	select {
	case r := <-chat:
		if !strings.HasPrefix(r, "chat: 200 ") || !strings.Contains(r, `"model":"chat"`) {
			t.Fatalf("chat: %s", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("chat never ran")
	}
	st := ts.in.Stats()
	// sql read and swapped in; then chat, pushed out of host memory by
	// sql, read and swapped in again.
	if loads, swaps := st.LoRALoads-before.LoRALoads, st.LoRASwaps-before.LoRASwaps; loads != 2 || swaps != 2 {
		t.Fatalf("loads %d swaps %d, want 2 and 2", loads, swaps)
	}
	testkit.WaitFor(t, 20*time.Second, "idle lora info", func() bool {
		labels, _ = loraInfoLabels(t, ts)
		return labels["running_lora_adapters"] == "" && labels["waiting_lora_adapters"] == ""
	})
}

// TestLoRALoadDelaysOnlyWhenNotResident: a request whose adapter is not
// resident waits for its load before its prefill; the next one for the
// same adapter does not.
func TestLoRALoadDelaysOnlyWhenNotResident(t *testing.T) {
	cfg := loraConfig()
	cfg.LoRAModules = cfg.LoRAModules[:1] // sql only, in host memory
	cfg.MaxLoRAs, cfg.MaxCPULoRAs = 1, 1
	cfg.LoRALoadTime, cfg.LoRASwapTime = 400*time.Millisecond, 200*time.Millisecond
	cfg.AllowRuntimeLoRAUpdating = true
	ts := startInstance(t, cfg)
	ttft := func(model string) time.Duration {
		t.Helper()
		r := ts.stream(t, t.Context(), "/v1/chat/completions", modelBody(model, words("p", 200), `,"max_tokens":2,"stream":true`))
		return r.ttft
	}
	st0 := ts.in.Stats()
	// sql is in host memory, not in a GPU slot: only the swap.
	if d := ttft("sql"); d < 200*time.Millisecond {
		t.Fatalf("first sql request: TTFT %v, below the 200 ms swap", d)
	}
	st1 := ts.in.Stats()
	if st1.LoRALoads != st0.LoRALoads || st1.LoRASwaps != st0.LoRASwaps+1 {
		t.Fatalf("first sql request: loads %d swaps %d, want 0 and 1", st1.LoRALoads-st0.LoRALoads, st1.LoRASwaps-st0.LoRASwaps)
	}
	// Resident now: neither read nor swapped again.
	ttft("sql")
	if st2 := ts.in.Stats(); st2.LoRALoads != st1.LoRALoads || st2.LoRASwaps != st1.LoRASwaps {
		t.Fatalf("resident sql: loads %d swaps %d, want none", st2.LoRALoads-st1.LoRALoads, st2.LoRASwaps-st1.LoRASwaps)
	}
	// A second adapter loaded at run time takes host memory from sql;
	// sql's next request reads it from disk and swaps it in.
	if code, b := ts.postLoRA(t, "/v1/load_lora_adapter", `{"lora_name":"other","lora_path":"/o"}`); code != 200 {
		t.Fatalf("load: %d %s", code, b)
	}
	st3 := ts.in.Stats()
	if d := ttft("sql"); d < 600*time.Millisecond {
		t.Fatalf("sql read again: TTFT %v, below the 600 ms read and swap", d)
	}
	if st4 := ts.in.Stats(); st4.LoRALoads != st3.LoRALoads+1 || st4.LoRASwaps != st3.LoRASwaps+1 {
		t.Fatalf("sql read again: loads %d swaps %d, want 1 and 1", st4.LoRALoads-st3.LoRALoads, st4.LoRASwaps-st3.LoRASwaps)
	}
}

// TestLoRAAbortWhileLoading: a client gone while its adapter loads frees
// its slot and blocks at once.
func TestLoRAAbortWhileLoading(t *testing.T) {
	cfg := loraConfig()
	cfg.MaxLoRAs, cfg.MaxCPULoRAs = 1, 1
	cfg.LoRALoadTime = time.Hour
	ts := startInstance(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+"/v1/chat/completions", strings.NewReader(modelBody("sql", "x", `,"max_tokens":2`)))
		if resp, err := ts.c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testkit.WaitFor(t, 20*time.Second, "sql loading", func() bool { return ts.in.Stats().Running == 1 })
	cancel()
	<-done
	testkit.WaitFor(t, 20*time.Second, "the abort", func() bool { st := ts.in.Stats(); return st.Running == 0 && st.Aborted == 1 && st.KVBlocksUsed == 0 })
	testkit.WaitFor(t, 20*time.Second, "sql's slot given up", func() bool {
		l, _ := loraInfoLabels(t, ts)
		return l["running_lora_adapters"] == ""
	})
}

func TestLoRAConfigValidated(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"modules without LoRA", func(c *Config) { c.EnableLoRA = false }},
		{"duplicate module", func(c *Config) { c.LoRAModules = append(c.LoRAModules, LoRAModule{Name: "sql", Path: "/x"}) }},
		{"module named as the base", func(c *Config) { c.LoRAModules[0].Name = baseModel }},
		{"empty path", func(c *Config) { c.LoRAModules[0].Path = "" }},
		{"name with a newline", func(c *Config) { c.LoRAModules[0].Name = "a\nb" }},
		{"max loras 0", func(c *Config) { c.MaxLoRAs = 0 }},
		{"cpu below gpu", func(c *Config) { c.MaxLoRAs, c.MaxCPULoRAs = 4, 2 }},
		{"too many cpu", func(c *Config) { c.MaxCPULoRAs = MaxLoRAAdapters + 1 }},
		{"negative load", func(c *Config) { c.LoRALoadTime = -1 }},
	} {
		c := loraConfig()
		tc.edit(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if err := loraConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseLoRAModule(t *testing.T) {
	for in, want := range map[string]LoRAModule{
		"sql=/adapters/sql": {Name: "sql", Path: "/adapters/sql"},
		`{"name":"sql","path":"/a/b","base_model_name":"m"}`: {Name: "sql", Path: "/a/b", BaseModelName: "m"},
		`{"name": "x", "path": "/p=q"}`:                      {Name: "x", Path: "/p=q"},
	} {
		if got, err := ParseLoRAModule(in); err != nil || got != want {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, in := range []string{"sql", "a=b=c", `{"name":"x","path":"/p","rank":8}`, `{"name":"x"} {}`, "a=b,c", ""} {
		if _, err := ParseLoRAModule(in); !errors.Is(err, ErrBadLoRAModule) {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestFleetInstanceLoRAModules(t *testing.T) {
	cfg := loraConfig()
	cfg.LoRAModules = []LoRAModule{{Name: "all", Path: "/all"}}
	f, err := StartFleet(t.Context(), FleetConfig{N: 3, Instance: cfg,
		InstanceLoRAModules: map[int][]LoRAModule{1: {{Name: "one", Path: "/one"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, want := range []string{"all", "all,one", "all"} {
		if got := strings.Join(f.Instances()[i].LoRAAdapters(), ","); got != want {
			t.Errorf("instance %d serves %q, want %q", i, got, want)
		}
	}
	if _, err := StartFleet(t.Context(), FleetConfig{N: 2, Instance: cfg,
		InstanceLoRAModules: map[int][]LoRAModule{2: {{Name: "x", Path: "/x"}}}}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("modules for instance 2 of 2: %v", err)
	}
}
