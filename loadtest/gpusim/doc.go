// Package gpusim simulates vLLM GPU instances (OpenAI-compatible server, V1
// engine) closely enough that prefix caching has its real effects: a cached
// prefix cuts time-to-first-token, load raises it, and a bounded KV cache
// evicts. It is warmroute's embedded default backend and the test double of
// the router, the load tests and the demo.
//
// # The model
//
// A prompt is rendered to text (chat messages as a chat template would
// render them) and cut into tokens of Config.BytesPerToken bytes. Every full
// block of Config.BlockSize tokens gets a hash chained on its parent's, as
// vLLM's hash_block_tokens does. The KV pool holds Config.KVCacheBlocks
// blocks, ref-counted by the running requests; blocks of finished requests
// stay cached in an LRU free queue until evicted. A request's cached prefix
// is the longest run of leading full blocks in the cache, leaving at least
// its last prompt token to compute (as vLLM does).
//
// Time-to-first-token is Overhead + queueing + uncached tokens /
// PrefillTokensPerSec, the prefill throughput being shared equally among
// concurrent prefills, and a waiting request starts its prefill only while
// those in progress have fewer than MaxNumBatchedTokens tokens left. Decode
// runs in steps of ITLBase + ITLPerSeq x
// running requests, each giving every running request one token. At most
// MaxNumSeqs requests run; later ones wait in a FIFO queue, as do requests
// whose KV blocks do not fit (KVAdmissionCheck). TimeScale multiplies every
// modelled duration. docs/gpusim.md gives the defaults and their sources.
//
// # LoRA adapters
//
// With EnableLoRA an instance serves LoRA adapters as vLLM does (lora.go):
// those of LoRAModules from the start (FleetConfig.InstanceLoRAModules for
// one instance only), others loaded at run time when
// AllowRuntimeLoRAUpdating is set. Each is a model of its own in
// /v1/models (with its parent and root) and in requests; its prompt blocks
// are hashed under its name, so it shares no cache with the base model or
// another adapter. MaxLoRAs GPU slots and MaxCPULoRAs adapters in host
// memory are LRU caches; a request whose adapter holds no slot waits
// LoRASwapTime (and LoRALoadTime when it was not in host memory) before its
// prefill, and one whose adapter would be one too many in the running
// batch is passed over for the requests behind it.
//
// # HTTP API
//
// POST /v1/chat/completions, /v1/completions (streaming or not, with
// stream_options.include_usage), /v1/responses (rendered and cached as
// chat; the Responses SSE events when streamed), /v1/embeddings,
// /v1/rerank, /v1/score, /tokenize, /detokenize and
// /v1/audio/transcriptions (deterministic answers, without the engine),
// GET /v1/models, POST /invocations and
// GET /ping (SageMaker), GET /health, GET /metrics (vLLM V1 metric names),
// GET /admin/stats, GET|POST /admin/faults, POST /reset_prefix_cache, and
// POST /v1/load_lora_adapter and /v1/unload_lora_adapter when allowed.
// Every response carries X-Gpusim-Instance: <name>. Errors are vLLM's
// {"error":{"message","type","param","code"}}.
//
// # Library use
//
// Tests of other packages start instances in process:
//
//	cfg := gpusim.DefaultConfig()
//	cfg.TimeScale = 0.01
//	fleet, err := gpusim.StartFleet(ctx, gpusim.FleetConfig{N: 3, Instance: cfg})
//	if err != nil { ... }
//	defer fleet.Close()
//	urls := fleet.URLs() // "http://127.0.0.1:PORT", one per instance
//	stats := fleet.Instances()[0].Stats()
//
// or serve one instance's handler themselves:
//
//	in, err := gpusim.New(cfg)
//	srv := httptest.NewServer(in.Handler())
//	defer srv.Close()
//	defer in.Close() // runs first: aborts in-flight requests, so srv.Close need not wait for them
//
// FastConfig is the model with latencies of about a millisecond, for tests
// that need answers at once rather than the modelled timing.
//
// Instance.SetFaults makes a fraction of requests fail (500) or stall;
// Instance.Stats reports running, waiting, completed, aborted (client went
// away mid-request) and cached-token totals.
package gpusim
