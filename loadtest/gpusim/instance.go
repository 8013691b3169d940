package gpusim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Instance is one simulated vLLM server: an HTTP handler in front of an
// engine with its own KV cache, load and metrics registry.
type Instance struct {
	cfg            Config
	c              counters
	m              *metrics
	eng            *engine
	fill           *filler
	faults         atomic.Pointer[Faults]
	metricsHandler http.Handler

	modelJSON []byte // cfg.Model as a JSON string
	loras     *loraRegistry
	created   int64
	bufs      sync.Pool // *[]byte prompt render buffers

	closing   chan struct{}
	closeOnce sync.Once
}

var _ http.Handler = (*Instance)(nil)

// New validates cfg and starts the instance's engine. Close stops it.
func New(cfg Config) (*Instance, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	in := &Instance{cfg: cfg, fill: newFiller(), created: time.Now().Unix(), closing: make(chan struct{}),
		loras: newLoRARegistry()}
	in.m = newMetrics(&in.cfg, &in.c)
	in.metricsHandler = promhttp.HandlerFor(in.m.reg, promhttp.HandlerOpts{})
	in.modelJSON, _ = json.Marshal(cfg.Model)
	f := cfg.Faults
	in.faults.Store(&f)
	in.bufs.New = func() any { b := make([]byte, 0, 16<<10); return &b }
	in.eng = newEngine(&in.cfg, &in.c, in.m)
	// The adapters of --lora-modules are loaded at start, into host memory
	// as far as it holds them (the last ones stay), as vLLM loads them.
	for _, m := range cfg.LoRAModules {
		in.loras.add(newLoRAAdapter(m.Name, m.Path))
		in.c.loraLoads.Add(1)
		in.eng.lora.cache(m.Name)
	}
	in.eng.publish()
	go in.eng.run()
	return in, nil
}

// Name is the instance's name (Config.Name).
func (in *Instance) Name() string { return in.cfg.Name }

// Handler returns the instance's HTTP API.
func (in *Instance) Handler() http.Handler { return in }

// Close aborts in-flight requests, stops the engine and waits for it.
// Calling it again is a no-op.
func (in *Instance) Close() error {
	in.closeOnce.Do(func() {
		close(in.closing)
		in.eng.close()
	})
	return nil
}

// Faults returns the current fault injection settings.
func (in *Instance) Faults() Faults { return *in.faults.Load() }

// SetFaults replaces the fault injection settings.
func (in *Instance) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	in.faults.Store(&f)
	return nil
}

// ResetPrefixCache evicts every cached block that no running request holds
// and returns how many it evicted.
func (in *Instance) ResetPrefixCache() (int, error) {
	n := 0
	if !in.eng.do(func() { n = in.eng.kv.reset() }) {
		return 0, ErrClosed
	}
	return n, nil
}

// Stats is a snapshot of an instance's counters and state, served as JSON
// at GET /admin/stats.
type Stats struct {
	Name  string `json:"name"`
	Model string `json:"model"`
	// Running and Waiting are the engine's current requests (vLLM's
	// num_requests_running / num_requests_waiting).
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// Completed requests finished generating; Aborted ones lost their
	// client first; Failed ones got an injected 500; Stalled ones were
	// delayed by an injected stall.
	Completed uint64 `json:"completed"`
	Aborted   uint64 `json:"aborted"`
	Failed    uint64 `json:"failed"`
	Stalled   uint64 `json:"stalled"`
	// Token totals. CachedTokens is the sum of every admitted request's
	// cached_tokens (= vllm:prefix_cache_hits); PrefixCacheQueries is the
	// sum of their prompt tokens.
	PromptTokens       uint64 `json:"prompt_tokens"`
	GenerationTokens   uint64 `json:"generation_tokens"`
	PrefixCacheQueries uint64 `json:"prefix_cache_queries"`
	CachedTokens       uint64 `json:"cached_tokens"`
	// KV cache state.
	KVCacheUsage   float64 `json:"kv_cache_usage"`
	KVBlocksTotal  int     `json:"kv_blocks_total"`
	KVBlocksUsed   int     `json:"kv_blocks_used"`
	KVBlocksCached int     `json:"kv_blocks_cached"`
	KVEvictions    uint64  `json:"kv_evictions"`
	// LoRA: adapters read from disk into host memory, and copied into a
	// GPU slot.
	LoRALoads uint64     `json:"lora_loads"`
	LoRASwaps uint64     `json:"lora_swaps"`
	Faults    faultsJSON `json:"faults"`
}

// Stats returns the current counters and state.
func (in *Instance) Stats() Stats {
	c := &in.c
	return Stats{
		Name: in.cfg.Name, Model: in.cfg.Model,
		Running: int(c.running.Load()), Waiting: int(c.waiting.Load()),
		Completed: c.successStop.Load() + c.successLength.Load(),
		Aborted:   c.aborted.Load(), Failed: c.failed.Load(), Stalled: c.stalled.Load(),
		PromptTokens: c.promptTokens.Load(), GenerationTokens: c.generationTokens.Load(),
		PrefixCacheQueries: c.cacheQueries.Load(), CachedTokens: c.cacheHits.Load(),
		KVCacheUsage:   math.Float64frombits(c.kvUsage.Load()),
		KVBlocksTotal:  in.cfg.KVCacheBlocks,
		KVBlocksUsed:   int(c.kvUsedBlocks.Load()),
		KVBlocksCached: int(c.kvCachedBlocks.Load()),
		KVEvictions:    c.kvEvictions.Load(),
		LoRALoads:      c.loraLoads.Load(),
		LoRASwaps:      c.loraSwaps.Load(),
		Faults:         toFaultsJSON(in.Faults()),
	}
}

// faultsJSON is Faults on the wire (the stall in seconds).
type faultsJSON struct {
	FailFraction  *float64 `json:"fail_fraction,omitempty"`
	StallFraction *float64 `json:"stall_fraction,omitempty"`
	StallSeconds  *float64 `json:"stall_seconds,omitempty"`
}

func toFaultsJSON(f Faults) faultsJSON {
	s := f.StallFor.Seconds()
	return faultsJSON{FailFraction: &f.FailFraction, StallFraction: &f.StallFraction, StallSeconds: &s}
}

// ServeHTTP routes the vLLM/OpenAI, SageMaker and admin endpoints.
func (in *Instance) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Gpusim-Instance", in.cfg.Name)
	switch r.URL.Path {
	case "/v1/chat/completions":
		if allow(w, r, http.MethodPost) {
			in.serveGenerate(w, r, endpointChat)
		}
	case "/v1/completions":
		if allow(w, r, http.MethodPost) {
			in.serveGenerate(w, r, endpointCompletion)
		}
	case "/invocations":
		if allow(w, r, http.MethodPost) {
			in.serveGenerate(w, r, endpointInvocations)
		}
	case "/v1/responses":
		if allow(w, r, http.MethodPost) {
			in.serveGenerate(w, r, endpointResponses)
		}
	case "/v1/embeddings":
		if allow(w, r, http.MethodPost) {
			in.serveBody(w, r, in.embeddings)
		}
	case "/v1/rerank", "/rerank", "/v2/rerank":
		if allow(w, r, http.MethodPost) {
			in.serveBody(w, r, in.rerank)
		}
	case "/v1/score", "/score":
		if allow(w, r, http.MethodPost) {
			in.serveBody(w, r, in.score)
		}
	case "/tokenize":
		if allow(w, r, http.MethodPost) {
			in.serveBody(w, r, in.tokenize)
		}
	case "/detokenize":
		if allow(w, r, http.MethodPost) {
			in.serveBody(w, r, in.detokenize)
		}
	case "/v1/audio/transcriptions", "/v1/audio/translations":
		if allow(w, r, http.MethodPost) {
			in.serveDirect(w, r, in.serveAudio)
		}
	case "/v1/models":
		if allow(w, r, http.MethodGet) {
			in.serveModels(w)
		}
	case "/ping", "/health":
		if allow(w, r, http.MethodGet) {
			if in.isClosed() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		}
	case "/metrics":
		if allow(w, r, http.MethodGet) {
			in.metricsHandler.ServeHTTP(w, r)
		}
	case "/admin/stats":
		if allow(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, in.Stats())
		}
	case "/admin/faults":
		if allow(w, r, http.MethodGet, http.MethodPost) {
			in.serveFaults(w, r)
		}
	case "/v1/load_lora_adapter":
		if !in.cfg.AllowRuntimeLoRAUpdating {
			notFound(w)
		} else if allow(w, r, http.MethodPost) {
			in.serveLoadLoRA(w, r)
		}
	case "/v1/unload_lora_adapter":
		if !in.cfg.AllowRuntimeLoRAUpdating {
			notFound(w)
		} else if allow(w, r, http.MethodPost) {
			in.serveUnloadLoRA(w, r)
		}
	case "/reset_prefix_cache", "/admin/reset_prefix_cache":
		if allow(w, r, http.MethodPost) {
			n, err := in.ResetPrefixCache()
			if err != nil {
				writeError(w, unavailable())
				return
			}
			writeJSON(w, http.StatusOK, map[string]int{"evicted_blocks": n})
		}
	default:
		notFound(w)
	}
}

// notFound answers a path the instance does not serve.
func notFound(w http.ResponseWriter) {
	writeError(w, &apiError{status: http.StatusNotFound, typ: "Not Found", message: "Not Found"})
}

// allow answers 405 unless r's method is one of methods (HEAD counts as
// GET).
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
			return true
		}
	}
	allowed := methods[0]
	for _, m := range methods[1:] {
		allowed += ", " + m
	}
	w.Header().Set("Allow", allowed)
	writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "Method Not Allowed", message: "Method Not Allowed"})
	return false
}

func unavailable() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", message: "gpusim instance is shutting down"}
}

func (in *Instance) isClosed() bool {
	select {
	case <-in.closing:
		return true
	default:
		return false
	}
}

// serveModels lists the base model, then the adapters in the order they
// were loaded, each with its path as root and the base model as parent
// (and no max_model_len), as vLLM's model cards do.
func (in *Instance) serveModels(w http.ResponseWriter) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
	}
	maxLen, base := in.cfg.MaxModelLen, in.cfg.Model
	data := []model{{ID: base, Object: "model", Created: in.created, OwnedBy: "vllm", Root: base, MaxModelLen: &maxLen}}
	for _, a := range in.loras.list() {
		data = append(data, model{ID: a.name, Object: "model", Created: in.created, OwnedBy: "vllm", Root: a.path, Parent: &base})
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", data})
}

func (in *Instance) serveFaults(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		var fj faultsJSON
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&fj); err != nil {
			writeError(w, validationError("JSON decode error: %v", err))
			return
		}
		f := in.Faults()
		if fj.FailFraction != nil {
			f.FailFraction = *fj.FailFraction
		}
		if fj.StallFraction != nil {
			f.StallFraction = *fj.StallFraction
		}
		if fj.StallSeconds != nil {
			s := *fj.StallSeconds
			if math.IsNaN(s) || s < 0 || s > 1e6 {
				writeError(w, badRequest("stall_seconds must be in [0, 1e6]"))
				return
			}
			f.StallFor = time.Duration(s * float64(time.Second))
		}
		if err := in.SetFaults(f); err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
	}
	writeJSON(w, http.StatusOK, toFaultsJSON(in.Faults()))
}

// serveGenerate handles chat completions, completions and invocations.
func (in *Instance) serveGenerate(w http.ResponseWriter, r *http.Request, ep endpoint) {
	arrival := time.Now()
	if in.isClosed() {
		writeError(w, unavailable())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, in.cfg.MaxRequestBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, &apiError{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError",
				message: fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit)})
			return
		}
		writeError(w, badRequest("reading request body: %v", err))
		return
	}
	bufp := in.bufs.Get().(*[]byte)
	p, aerr := parseRequest(body, ep, in.cfg.BytesPerToken, *bufp)
	var shape promptShape
	if aerr == nil {
		p.adapter, p.modelJSON, aerr = in.modelFor(p.model)
	}
	if aerr == nil {
		shape = shapePrompt(p.text, p.unit, in.cfg.BlockSize, p.salt, p.adapter)
	}
	if cap(p.text) <= 1<<20 {
		*bufp = p.text[:0]
		in.bufs.Put(bufp)
	}
	p.text = nil // back in the pool
	if aerr == nil {
		aerr = in.check(&p, shape)
	}
	if aerr != nil {
		writeError(w, aerr)
		return
	}

	ctx := r.Context()
	if !in.admit(ctx, w) {
		return
	}
	s := newSeq(shape, p.maxTokens, p.limited, arrival, p.adapter)
	if !in.eng.submit(s) {
		writeError(w, unavailable())
		return
	}
	rs := &response{in: in, p: &p, s: s, id: newID(p.chat), created: time.Now().Unix()}
	if p.stream {
		rs.stream(ctx, w)
	} else {
		rs.full(ctx, w)
	}
}

// admit applies the injected faults (a failure answered at once, a
// stall) and the fixed per-request overhead before a request is served.
// It reports false when the request is done: failed, or its client gone.
func (in *Instance) admit(ctx context.Context, w http.ResponseWriter) bool {
	f := in.faults.Load()
	if f.FailFraction > 0 && rand.Float64() < f.FailFraction {
		in.c.failed.Add(1)
		writeError(w, &apiError{status: http.StatusInternalServerError, typ: "InternalServerError",
			message: "gpusim: injected failure"})
		return false
	}
	if f.StallFraction > 0 && rand.Float64() < f.StallFraction {
		in.c.stalled.Add(1)
		if !in.sleep(ctx, f.StallFor) {
			in.c.aborted.Add(1)
			return false
		}
	}
	if !in.sleep(ctx, in.cfg.scaled(in.cfg.Overhead)) {
		in.c.aborted.Add(1)
		return false
	}
	return true
}

// check applies the validations that need the configuration (the model
// name was resolved before): the context length and the KV capacity. It
// fills in the default output length.
func (in *Instance) check(p *parsedRequest, shape promptShape) *apiError {
	n, maxLen := shape.tokens, in.cfg.MaxModelLen
	if n >= maxLen {
		return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "input_tokens",
			message: fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
				"Please reduce the length of the input messages.", maxLen, n)}
	}
	if !p.limited {
		p.maxTokens = min(in.cfg.DefaultMaxTokens, maxLen-n)
	} else if n+p.maxTokens > maxLen {
		return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "max_tokens",
			message: fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is "+
				"%d tokens and your request has %d input tokens (%d > %d - %d).", p.maxTokens, maxLen, n, p.maxTokens, maxLen, n)}
	}
	b := in.cfg.BlockSize
	if blocks := (n + p.maxTokens + b - 1) / b; in.cfg.KVAdmissionCheck && blocks > in.cfg.KVCacheBlocks {
		return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "input_tokens",
			message: fmt.Sprintf("The request needs %d KV-cache blocks (%d prompt + %d output tokens) but the cache holds %d.",
				blocks, n, p.maxTokens, in.cfg.KVCacheBlocks)}
	}
	return nil
}

// sleep waits d, or returns false if ctx ends or the instance closes first.
func (in *Instance) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-in.closing:
		return false
	}
}

func newID(chat bool) string {
	const hex = "0123456789abcdef"
	var b [9 + 32]byte
	n := copy(b[:], "cmpl-")
	if chat {
		n = copy(b[:], "chatcmpl-")
	}
	for _, v := range [2]uint64{rand.Uint64(), rand.Uint64()} {
		for i := 0; i < 16; i++ {
			b[n] = hex[v>>60]
			v <<= 4
			n++
		}
	}
	return string(b[:n])
}

// errorBody is vLLM's ErrorResponse.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, e *apiError) {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = e.message, e.typ, e.status
	if e.param != "" {
		b.Error.Param = &e.param
	}
	writeJSON(w, e.status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding response","type":"InternalServerError","param":null,"code":500}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
