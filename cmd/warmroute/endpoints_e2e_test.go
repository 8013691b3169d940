package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// The endpoints beyond chat and completions, end to end: the official
// openai-go client through the real binary in front of a gpusim fleet, and
// every body passed through to the backend byte for byte.

var gpusimURLs = regexp.MustCompile(`gpusim: \S+ serving \S+ at (http://\S+)\n`)

// startGpusimFleet runs `warmroute gpusim` with n fast instances on free
// loopback ports and returns their URLs.
func startGpusimFleet(t *testing.T, n int) []string {
	t.Helper()
	a := proc.GpusimArgs{Instances: n, Listen: "127.0.0.1:0", TimeScale: 0.01}
	p, err := proc.Start(proc.Spec{Name: "gpusim", Path: binPath, Args: a.Args()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	var urls []string
	if err := p.WaitReady(context.Background(), 15*time.Second, func(context.Context) error {
		urls = urls[:0]
		for _, m := range gpusimURLs.FindAllStringSubmatch(p.Logs(), -1) {
			urls = append(urls, m[1])
		}
		if len(urls) < n {
			return errors.New("not every address printed yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return urls
}

// headerTap records the warmroute headers of the last response.
type headerTap struct {
	mu      sync.Mutex
	backend string
	dec     string
}

func (h *headerTap) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		h.mu.Lock()
		h.backend, h.dec = resp.Header.Get("X-Warmroute-Backend"), resp.Header.Get("X-Warmroute-Decision")
		h.mu.Unlock()
	}
	return resp, err
}

func (h *headerTap) last() (string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.backend, h.dec
}

func TestE2EOpenAIClientEmbeddingsResponses(t *testing.T) {
	t.Parallel()
	needBinary(t)
	urls := startGpusimFleet(t, 3)
	r := startRouter(t, proc.ServeArgs{Backends: urls})
	addrs := map[string]bool{}
	for _, u := range urls {
		addrs[strings.TrimPrefix(u, "http://")] = true
	}
	tap := &headerTap{}
	client := openai.NewClient(option.WithBaseURL(r.url+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(&http.Client{Transport: tap, Timeout: 30 * time.Second}), option.WithMaxRetries(0))
	ctx := t.Context()
	routed := func(what string) string {
		t.Helper()
		b, d := tap.last()
		if !addrs[b] || d != "affinity" {
			t.Fatalf("%s: X-Warmroute-Backend %q, X-Warmroute-Decision %q; want one of %v by affinity", what, b, d, urls)
		}
		return b
	}

	// Embeddings: a vector per input, the same vector for the same text.
	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: gpusimModel,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"the quick brown fox", "jumps over"}},
	})
	if err != nil {
		t.Fatalf("embeddings: %v", err)
	}
	routed("embeddings")
	if len(emb.Data) != 2 || emb.Data[1].Index != 1 || len(emb.Data[0].Embedding) != 32 || emb.Model != gpusimModel ||
		emb.Usage.PromptTokens != 5+3 || emb.Usage.TotalTokens != 8 {
		t.Fatalf("embeddings: %s", emb.RawJSON())
	}
	var n2 float64
	for _, x := range emb.Data[0].Embedding {
		n2 += x * x
	}
	if math.Abs(n2-1) > 1e-5 {
		t.Fatalf("embedding norm^2 %v", n2)
	}
	one, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model:          gpusimModel,
		Input:          openai.EmbeddingNewParamsInputUnion{OfString: openai.String("the quick brown fox")},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64,
	})
	if err != nil {
		t.Fatalf("embeddings base64: %v", err)
	}
	for i, x := range one.Data[0].Embedding {
		if math.Abs(x-emb.Data[0].Embedding[i]) > 1e-6 {
			t.Fatalf("base64 vector %v differs from float vector %v", one.Data[0].Embedding, emb.Data[0].Embedding)
		}
	}

	// Responses, not streamed: the first answer computes the prompt, the
	// second is routed to the same backend and finds it cached.
	instructions := strings.Repeat("You answer questions about the warmroute router. ", 60)
	params := responses.ResponseNewParams{
		Model:           gpusimModel,
		Instructions:    openai.String(instructions),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("What does the router key on?")},
		MaxOutputTokens: openai.Int(16),
	}
	wantInput := int64((len("<|system|>\n"+instructions+"<|eot|>\n<|user|>\nWhat does the router key on?<|eot|>\n<|assistant|>\n") + 3) / 4)
	res, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatalf("responses: %v", err)
	}
	first := routed("responses")
	if !strings.HasPrefix(res.ID, "resp_") || len(res.Output) != 1 || len(strings.Fields(res.OutputText())) != 16 ||
		res.Usage.InputTokens != wantInput || res.Usage.OutputTokens != 16 || res.Usage.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("response: %s", res.RawJSON())
	}
	again, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatalf("responses again: %v", err)
	}
	if b := routed("responses again"); b != first {
		t.Fatalf("the same input went to %s, then %s", first, b)
	}
	if again.OutputText() != res.OutputText() || again.Usage.InputTokensDetails.CachedTokens != (wantInput-1)/16*16 {
		t.Fatalf("repeated response: %s", again.RawJSON())
	}

	// The same conversation as chat keys alike, so it reaches the same
	// backend, whose cache holds the prompt the Responses request left.
	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: gpusimModel,
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(instructions), openai.UserMessage("What does the router key on?"),
		},
		MaxCompletionTokens: openai.Int(16),
	})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if b := routed("chat"); b != first {
		t.Fatalf("the same conversation as chat went to %s, not %s", b, first)
	}
	if chat.Usage.PromptTokens != wantInput || chat.Usage.PromptTokensDetails.CachedTokens != (wantInput-1)/16*16 ||
		chat.Choices[0].Message.Content != res.OutputText() {
		t.Fatalf("chat after responses: %s", chat.RawJSON())
	}

	// Streamed: the events, the same text, the cache hit in the usage.
	stream := client.Responses.NewStreaming(ctx, params)
	var types []string
	var text strings.Builder
	var final responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("responses stream: %v", err)
	}
	if b := routed("responses stream"); b != first {
		t.Fatalf("the streamed request went to %s, not %s", b, first)
	}
	if len(types) < 9 || types[0] != "response.created" || !strings.Contains(strings.Join(types, " "), "response.output_text.delta") ||
		types[len(types)-1] != "response.incomplete" {
		t.Fatalf("events %v", types)
	}
	if text.String() != res.OutputText() || final.OutputText() != text.String() || final.Status != "incomplete" ||
		final.Usage.InputTokensDetails.CachedTokens != (wantInput-1)/16*16 {
		t.Fatalf("streamed %q, final %s", text.String(), final.RawJSON())
	}

	// Without a limit the stream ends with response.completed.
	params = responses.ResponseNewParams{Model: gpusimModel, Input: params.Input}
	stream = client.Responses.NewStreaming(ctx, params)
	last := ""
	for stream.Next() {
		last = stream.Current().Type
	}
	if err := stream.Err(); err != nil || last != "response.completed" {
		t.Fatalf("stream without a limit ended with %q: %v", last, err)
	}
}

// recorder is a backend that records every POST's path, Content-Type and
// body and answers {"ok":true}.
type recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []recorded
}

type recorded struct {
	path, contentType string
	body              []byte
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return // health probes and metrics scrapes
		}
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.got = append(rec.got, recorded{r.URL.Path, r.Header.Get("Content-Type"), b})
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) take() []recorded {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	got := rec.got
	rec.got = nil
	return got
}

// endpointBody is a request to one of the new endpoints.
type endpointBody struct {
	path, contentType string
	body              []byte
}

func audioBody(t *testing.T, path string) endpointBody {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	mw.WriteField("model", gpusimModel)
	mw.WriteField("language", "en")
	mw.WriteField("prompt", "A talk about routers.")
	mw.WriteField("response_format", "json")
	mw.WriteField("temperature", "0")
	fw, err := mw.CreateFormFile("file", "speech.wav")
	if err != nil {
		t.Fatal(err)
	}
	audio := make([]byte, 8192)
	for i := range audio {
		audio[i] = byte(i * 7) // every byte value, CR and LF among them
	}
	fw.Write(audio)
	mw.Close()
	return endpointBody{path, mw.FormDataContentType(), buf.Bytes()}
}

// newEndpointBodies are one valid request per new endpoint, written with
// odd spacing, escapes, key order and extra fields that the router must
// not normalise.
func newEndpointBodies(t *testing.T) []endpointBody {
	j := func(path, body string) endpointBody { return endpointBody{path, "application/json", []byte(body)} }
	return []endpointBody{
		j("/v1/embeddings", `{ "input" : ["caf\u00e9 au lait",  "second"], "model":"`+gpusimModel+`", "encoding_format":"float", "x_extra": {"k": [1, 2.50]} }`),
		j("/v1/embeddings", "{\"input\":[[101,  2023 ,102]],\n\"model\":\""+gpusimModel+"\"}"),
		j("/v1/responses", `{"tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}], "model":"`+gpusimModel+`",`+
			`"instructions":"Be brief.\n","input":[{"role":"user","content":[{"type":"input_text","text":"Hi \"there\""}]},`+
			`{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{}"}],"max_output_tokens":4,"store":false}`),
		j("/v1/responses", `{"input":"plain string input",  "model":"`+gpusimModel+`","max_output_tokens":3}`),
		j("/v1/rerank", `{"model":"`+gpusimModel+`","query":"capital of France?","documents":["Paris is.","Berlin is not."],"top_n":1}`),
		j("/rerank", `{"query":"q\u00fcery","documents":["a","b"]}`),
		j("/v2/rerank", `{"documents":["x"],  "query":"what"}`),
		j("/v1/score", `{"model":"`+gpusimModel+`","text_1":"What is the capital of France?","text_2":["Paris.","Rome."]}`),
		j("/score", `{"text_1":["a","b"],"text_2":["c","d"]}`),
		j("/tokenize", `{"model":"`+gpusimModel+`","prompt":"Hello, world!","return_token_strs":true}`),
		j("/tokenize", `{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false}`),
		j("/detokenize", `{"model":"`+gpusimModel+`","tokens":[9906, 11, 1917, 0]}`),
		audioBody(t, "/v1/audio/transcriptions"),
		audioBody(t, "/v1/audio/translations"),
	}
}

func post(t *testing.T, url string, b endpointBody) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+b.path, b.contentType, bytes.NewReader(b.body))
	if err != nil {
		t.Fatalf("POST %s: %v", b.path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: %v", b.path, err)
	}
	return resp, body
}

func TestE2ENewEndpointsPassThrough(t *testing.T) {
	t.Parallel()
	needBinary(t)
	rec := newRecorder(t)
	r := startRouter(t, proc.ServeArgs{Backends: []string{rec.srv.URL}, NoEngineMetrics: true})
	addr := strings.TrimPrefix(rec.srv.URL, "http://")
	for _, b := range newEndpointBodies(t) {
		if strings.HasPrefix(b.contentType, "multipart/") {
			continue // TestE2EAudioPassThrough
		}
		resp, body := post(t, r.url, b)
		if resp.StatusCode != 200 || string(body) != `{"ok":true}` {
			t.Errorf("POST %s: %d %s", b.path, resp.StatusCode, body)
			continue
		}
		if got := resp.Header.Get("X-Warmroute-Backend"); got != addr {
			t.Errorf("POST %s: X-Warmroute-Backend %q, want %q", b.path, got, addr)
		}
		if resp.Header.Get("X-Warmroute-Decision") == "" {
			t.Errorf("POST %s: no X-Warmroute-Decision", b.path)
		}
		got := rec.take()
		if len(got) != 1 {
			t.Errorf("POST %s: the backend got %d requests, want 1", b.path, len(got))
			continue
		}
		if g := got[0]; g.path != b.path || g.contentType != b.contentType || !bytes.Equal(g.body, b.body) {
			at := 0
			for at < min(len(g.body), len(b.body)) && g.body[at] == b.body[at] {
				at++
			}
			t.Errorf("POST %s: the backend got %s (%s), %d bytes differing from byte %d; want %s (%s), %d bytes",
				b.path, g.path, g.contentType, len(g.body), at, b.path, b.contentType, len(b.body))
		}
	}

	// A missing or mistyped key field is refused by the router itself.
	refusedByRouter(t, r, rec)
}

// TestE2EAudioPassThrough sends multipart audio requests (five fields and
// a binary file) through the router: each must reach the backend byte for
// byte, in its field order, with its boundary.
//
// It fails while the router's fasthttp server pre-parses multipart bodies
// (fasthttp.Server.DisablePreParseMultipartForm is false in proxy/proxy.go):
// the form is then re-encoded on the way out from a map, so its fields
// reach the backend in random order, and files over 16 MiB are spooled to
// the router's disk.
func TestE2EAudioPassThrough(t *testing.T) {
	t.Parallel()
	needBinary(t)
	rec := newRecorder(t)
	r := startRouter(t, proc.ServeArgs{Backends: []string{rec.srv.URL}, NoEngineMetrics: true})
	for i := 0; i < 4; i++ {
		for _, path := range []string{"/v1/audio/transcriptions", "/v1/audio/translations"} {
			b := audioBody(t, path)
			resp, body := post(t, r.url, b)
			if resp.StatusCode != 200 || string(body) != `{"ok":true}` {
				t.Fatalf("POST %s: %d %s", path, resp.StatusCode, body)
			}
			got := rec.take()
			if len(got) != 1 {
				t.Fatalf("POST %s: the backend got %d requests, want 1", path, len(got))
			}
			if g := got[0]; g.path != path || g.contentType != b.contentType || !bytes.Equal(g.body, b.body) {
				at := 0
				for at < min(len(g.body), len(b.body)) && g.body[at] == b.body[at] {
					at++
				}
				t.Fatalf("POST %s: the backend got %s (%s), %d bytes differing from byte %d (%.80q); want %d bytes (%.80q)",
					path, g.path, g.contentType, len(g.body), at, g.body[at:], len(b.body), b.body[at:])
			}
		}
	}
}

func refusedByRouter(t *testing.T, r *router, rec *recorder) {
	t.Helper()
	for _, c := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"m"}`},
		{"/v1/embeddings", `{"input":{"text":"x"}}`},
		{"/v1/responses", `{"model":"m","instructions":"only instructions"}`},
		{"/v1/responses", `{"input":5}`},
		{"/v1/rerank", `{"documents":["a"]}`},
		{"/rerank", `{"query":5,"documents":["a"]}`},
		{"/v2/rerank", `{"documents":["a"]}`},
		{"/v1/score", `{"text_2":"a"}`},
		{"/score", `{"text_2":["a"]}`},
		{"/tokenize", `{"model":"m"}`},
		{"/detokenize", `{"model":"m"}`},
		{"/detokenize", `{"tokens":"1 2 3"}`},
	} {
		resp, body := post(t, r.url, endpointBody{c.path, "application/json", []byte(c.body)})
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != 400 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
			json.Unmarshal(body, &e) != nil || e.Error.Code != "invalid_request" || e.Error.Message == "" {
			t.Errorf("POST %s %s: %d %s, want 400 invalid_request", c.path, c.body, resp.StatusCode, body)
		}
		if got := rec.take(); len(got) != 0 {
			t.Errorf("POST %s %s reached the backend", c.path, c.body)
		}
	}
}

// TestE2ENewEndpointsOnGpusim sends the same requests through the router
// to a gpusim fleet and checks vLLM's answers.
func TestE2ENewEndpointsOnGpusim(t *testing.T) {
	t.Parallel()
	needBinary(t)
	urls := startGpusimFleet(t, 2)
	r := startRouter(t, proc.ServeArgs{Backends: urls})
	for _, b := range newEndpointBodies(t) {
		resp, body := post(t, r.url, b)
		if resp.StatusCode != 200 || resp.Header.Get("X-Gpusim-Instance") == "" || resp.Header.Get("X-Warmroute-Backend") == "" {
			t.Errorf("POST %s: %d %s", b.path, resp.StatusCode, body)
			continue
		}
		var v map[string]any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Errorf("POST %s: %s: %v", b.path, body, err)
			continue
		}
		var field string
		switch {
		case strings.HasSuffix(b.path, "embeddings"), strings.HasSuffix(b.path, "score"):
			field = "data"
		case strings.HasSuffix(b.path, "rerank"):
			field = "results"
		case b.path == "/v1/responses":
			field = "output"
		case b.path == "/tokenize":
			field = "tokens"
		case b.path == "/detokenize":
			field = "prompt"
		default:
			field = "text"
		}
		switch x := v[field].(type) {
		case []any:
			if len(x) == 0 {
				t.Errorf("POST %s: empty %s in %s", b.path, field, body)
			}
		case string:
			if x == "" {
				t.Errorf("POST %s: empty %s in %s", b.path, field, body)
			}
		default:
			t.Errorf("POST %s: no %s in %s", b.path, field, body)
		}
	}
	// gpusim's own 400s pass back through the router unchanged.
	resp, body := post(t, r.url, endpointBody{"/v1/embeddings", "application/json", []byte(`{"input":"x","encoding_format":"hex"}`)})
	if resp.StatusCode != 400 || !strings.Contains(string(body), "encoding_format") {
		t.Fatalf("bad encoding_format: %d %s", resp.StatusCode, body)
	}
}
