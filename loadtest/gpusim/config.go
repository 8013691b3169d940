package gpusim

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"
)

// Config is the model of one simulated GPU instance. Every field has a flag
// (BindFlags) and a default (DefaultConfig) calibrated to Llama-3.1-70B on one
// 8xH100 80GB instance; docs/gpusim.md gives the sources and the arithmetic.
// A Config is read once by New and never changed afterwards.
type Config struct {
	// Name identifies the instance in the X-Gpusim-Instance header and in
	// /admin/stats.
	Name string
	// Model is the served model name: the only value accepted in a
	// request's "model" field (an empty or absent model is accepted, as vLLM
	// does for its base model).
	Model string
	// MaxModelLen is the context length: prompt tokens plus max_tokens must
	// not exceed it (vLLM's --max-model-len; Llama-3.1 supports 131072).
	MaxModelLen int
	// DefaultMaxTokens is the output length when a request sets no
	// max_tokens/max_completion_tokens. Such requests finish with
	// finish_reason "stop" (the model ended on its own); requests that set
	// a limit run to it and finish with "length".
	DefaultMaxTokens int
	// BytesPerToken is the tokenizer approximation: every BytesPerToken
	// bytes of rendered prompt text are one token.
	BytesPerToken int

	// BlockSize is the KV-cache block size in tokens (vLLM --block-size).
	BlockSize int
	// KVCacheBlocks is the KV-cache capacity in blocks (vLLM's
	// num_gpu_blocks).
	KVCacheBlocks int
	// KVAdmissionCheck makes a request wait until the blocks it needs
	// (prompt plus max output) fit in the cache, as vLLM's scheduler does.
	// When false, requests are admitted regardless and the cache is only
	// used as far as it reaches.
	KVAdmissionCheck bool
	// MaxNumSeqs is the most requests running at once (vLLM
	// --max-num-seqs); later requests wait in a FIFO queue.
	MaxNumSeqs int
	// MaxNumBatchedTokens is vLLM's per-step token budget
	// (--max-num-batched-tokens): a waiting request starts its prefill
	// only while the prefills in progress have fewer tokens than this left
	// to compute (a request alone may exceed it).
	MaxNumBatchedTokens int

	// PrefillTokensPerSec is the instance's prefill throughput, shared
	// equally among the requests prefilling at the same time.
	PrefillTokensPerSec float64
	// Overhead is the fixed part of time-to-first-token (API server,
	// tokenization, scheduling, the first forward pass).
	Overhead time.Duration
	// StreamInterval is vLLM's --stream-interval: a stream sends its
	// tokens in chunks of this many (the first token at once). Tokens
	// that pile up while a client reads slowly are merged into one chunk
	// whatever the interval, as vLLM's output collector merges them.
	StreamInterval int
	// ITLBase and ITLPerSeq give the inter-token latency of a decode step:
	// ITLBase + ITLPerSeq x (requests running).
	ITLBase   time.Duration
	ITLPerSeq time.Duration

	// TimeScale multiplies every modelled duration (overhead, prefill,
	// decode steps): 0.1 runs the same model ten times faster. Fault stalls
	// are not scaled.
	TimeScale float64

	// Faults is the initial fault injection; it can be changed at run time
	// through POST /admin/faults or Instance.SetFaults.
	Faults Faults

	// MaxRequestBytes bounds a request body.
	MaxRequestBytes int64

	// LoRA adapters, as vLLM serves them (lora.go; docs/gpusim.md, "LoRA
	// adapters").
	//
	// EnableLoRA lets the instance serve adapters (vLLM's --enable-lora).
	// Without it LoRAModules must be empty and a runtime load fails, and
	// /metrics has no vllm:lora_requests_info.
	EnableLoRA bool
	// LoRAModules are the adapters served from the start (vLLM's
	// --lora-modules).
	LoRAModules []LoRAModule
	// MaxLoRAs is the number of GPU slots for adapters, so the most
	// distinct adapters in the running batch (vLLM's --max-loras, 1 by
	// default): a waiting request for another adapter is passed over
	// until one of the batch's adapters has no request left.
	MaxLoRAs int
	// MaxCPULoRAs is the most adapters kept in host memory (vLLM's
	// --max-cpu-loras); 0 means MaxLoRAs, vLLM's default. An adapter
	// pushed out is read from disk again when a request needs it.
	MaxCPULoRAs int
	// AllowRuntimeLoRAUpdating serves POST /v1/load_lora_adapter and
	// /v1/unload_lora_adapter, as vLLM does only when
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING is set; without it they are
	// unknown paths.
	AllowRuntimeLoRAUpdating bool
	// LoRALoadTime is the time to read an adapter from disk into host
	// memory; LoRASwapTime the time to copy one from host memory into a
	// GPU slot. A request whose adapter holds no GPU slot waits for them
	// before its prefill starts.
	LoRALoadTime time.Duration
	LoRASwapTime time.Duration
}

// Faults injects failures for chaos tests.
type Faults struct {
	// FailFraction of requests get a 500 with an OpenAI-style error body.
	FailFraction float64 `json:"fail_fraction"`
	// StallFraction of requests hang for StallFor before being served.
	StallFraction float64 `json:"stall_fraction"`
	// StallFor is how long a stalled request hangs (wall time, not scaled).
	StallFor time.Duration `json:"-"`
}

// DefaultConfig returns the calibrated defaults (see docs/gpusim.md).
func DefaultConfig() Config {
	return Config{
		Name:                "gpu-0",
		Model:               "meta-llama/Llama-3.1-70B-Instruct",
		MaxModelLen:         131072,
		DefaultMaxTokens:    64,
		BytesPerToken:       4,
		BlockSize:           16,
		KVCacheBlocks:       84000,
		KVAdmissionCheck:    true,
		MaxNumSeqs:          1024,
		MaxNumBatchedTokens: 8192,
		StreamInterval:      1,
		PrefillTokensPerSec: 15000,
		Overhead:            50 * time.Millisecond,
		ITLBase:             12 * time.Millisecond,
		ITLPerSeq:           60 * time.Microsecond,
		TimeScale:           1,
		Faults:              Faults{StallFor: 10 * time.Second},
		MaxRequestBytes:     32 << 20,
		MaxLoRAs:            1,
		LoRALoadTime:        400 * time.Millisecond,
		LoRASwapTime:        2 * time.Millisecond,
	}
}

// FastConfig returns DefaultConfig with its latencies cut to about a
// millisecond (overhead and decode steps of 1 ms, no slowdown per running
// request, 1e6 prefill tokens/s): a backend for tests that answers at once
// and still caches, queues and evicts as the model does.
func FastConfig() Config {
	c := DefaultConfig()
	c.Overhead = time.Millisecond
	c.ITLBase = time.Millisecond
	c.ITLPerSeq = 0
	c.PrefillTokensPerSec = 1e6
	return c
}

// Validate reports the first invalid field, wrapped in ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Name == "":
		return bad("name is empty")
	case c.Model == "":
		return bad("model is empty")
	case c.MaxModelLen < 2:
		return bad("max model len %d < 2", c.MaxModelLen)
	case c.DefaultMaxTokens < 1:
		return bad("default max tokens %d < 1", c.DefaultMaxTokens)
	case c.BytesPerToken < 1:
		return bad("bytes per token %d < 1", c.BytesPerToken)
	case c.BlockSize < 1:
		return bad("block size %d < 1", c.BlockSize)
	case c.KVCacheBlocks < 1:
		return bad("kv cache blocks %d < 1", c.KVCacheBlocks)
	case c.MaxNumSeqs < 1:
		return bad("max num seqs %d < 1", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 1:
		return bad("max num batched tokens %d < 1", c.MaxNumBatchedTokens)
	case c.StreamInterval < 1:
		return bad("stream interval %d < 1", c.StreamInterval)
	case !(c.PrefillTokensPerSec > 0):
		return bad("prefill tokens/s %v must be > 0", c.PrefillTokensPerSec)
	case c.Overhead < 0 || c.ITLBase < 0 || c.ITLPerSeq < 0:
		return bad("durations must not be negative")
	case !(c.TimeScale > 0):
		return bad("time scale %v must be > 0", c.TimeScale)
	case c.MaxRequestBytes < 1:
		return bad("max request bytes %d < 1", c.MaxRequestBytes)
	}
	if err := c.Faults.Validate(); err != nil {
		return err
	}
	return c.validateLoRA()
}

// Validate checks the fractions are in [0, 1] and the stall is not negative.
func (f Faults) Validate() error {
	if !(f.FailFraction >= 0 && f.FailFraction <= 1) || !(f.StallFraction >= 0 && f.StallFraction <= 1) {
		return fmt.Errorf("%w: fault fractions must be in [0, 1]", ErrInvalidConfig)
	}
	if f.StallFor < 0 {
		return fmt.Errorf("%w: stall duration must not be negative", ErrInvalidConfig)
	}
	return nil
}

// BindFlags registers one flag per model parameter on fs, writing into c.
// Call it on a Config holding the defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "context length in tokens (prompt + max_tokens)")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", c.DefaultMaxTokens, "output tokens when a request sets no max_tokens")
	fs.IntVar(&c.BytesPerToken, "bytes-per-token", c.BytesPerToken, "bytes of prompt text per token")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV-cache block size in tokens")
	fs.IntVar(&c.KVCacheBlocks, "kv-blocks", c.KVCacheBlocks, "KV-cache capacity in blocks")
	fs.BoolVar(&c.KVAdmissionCheck, "kv-admission", c.KVAdmissionCheck, "queue requests whose KV blocks do not fit")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "most requests running at once; more wait in a FIFO queue")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "prefill token budget: waiting requests start prefill while fewer tokens are left in progress")
	fs.IntVar(&c.StreamInterval, "stream-interval", c.StreamInterval, "tokens per streamed chunk (the first token is sent at once)")
	fs.Float64Var(&c.PrefillTokensPerSec, "prefill-tokens-per-sec", c.PrefillTokensPerSec, "prefill throughput, shared by concurrent prefills")
	fs.DurationVar(&c.Overhead, "overhead", c.Overhead, "fixed part of time-to-first-token")
	fs.DurationVar(&c.ITLBase, "itl-base", c.ITLBase, "inter-token latency of a decode step with no load")
	fs.DurationVar(&c.ITLPerSeq, "itl-per-seq", c.ITLPerSeq, "inter-token latency added per running request")
	fs.Float64Var(&c.TimeScale, "time-scale", c.TimeScale, "multiplier on every modelled duration (0.1 = 10x faster)")
	fs.Float64Var(&c.Faults.FailFraction, "fail-fraction", c.Faults.FailFraction, "fraction of requests answered with a 500")
	fs.Float64Var(&c.Faults.StallFraction, "stall-fraction", c.Faults.StallFraction, "fraction of requests that hang before being served")
	fs.DurationVar(&c.Faults.StallFor, "stall-for", c.Faults.StallFor, "how long a stalled request hangs (not scaled)")
	fs.Int64Var(&c.MaxRequestBytes, "max-request-bytes", c.MaxRequestBytes, "largest accepted request body")
	fs.BoolVar(&c.EnableLoRA, "enable-lora", c.EnableLoRA, "serve LoRA adapters")
	fs.Var(loraModulesFlag{&c.LoRAModules}, "lora-modules", "LoRA adapters served from the start: name=path or JSON {\"name\":...,\"path\":...,\"base_model_name\":...}; repeat the flag or list several after it (needs --enable-lora)")
	fs.IntVar(&c.MaxLoRAs, "max-loras", c.MaxLoRAs, "GPU slots for adapters: most distinct adapters in the running batch")
	fs.IntVar(&c.MaxCPULoRAs, "max-cpu-loras", c.MaxCPULoRAs, "adapters kept in host memory (0: --max-loras)")
	fs.BoolVar(&c.AllowRuntimeLoRAUpdating, "allow-runtime-lora-updating", c.AllowRuntimeLoRAUpdating, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
	fs.DurationVar(&c.LoRALoadTime, "lora-load-time", c.LoRALoadTime, "time to read an adapter from disk into host memory")
	fs.DurationVar(&c.LoRASwapTime, "lora-swap-time", c.LoRASwapTime, "time to copy an adapter from host memory into a GPU slot")
}

// loraModulesFlag appends one --lora-modules entry per use of the flag.
type loraModulesFlag struct{ mods *[]LoRAModule }

func (f loraModulesFlag) String() string {
	if f.mods == nil {
		return ""
	}
	var parts []string
	for _, m := range *f.mods {
		parts = append(parts, m.Name+"="+m.Path)
	}
	return strings.Join(parts, " ")
}

func (f loraModulesFlag) Set(s string) error {
	if len(*f.mods) >= MaxLoRAAdapters {
		return fmt.Errorf("at most %d LoRA modules", MaxLoRAAdapters)
	}
	m, err := ParseLoRAModule(s)
	if err != nil {
		return err
	}
	*f.mods = append(*f.mods, m)
	return nil
}

// scaled converts a modelled duration to wall time.
func (c *Config) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.TimeScale)
}

// Sentinel errors.
var (
	// ErrInvalidConfig wraps every Config or Faults validation failure.
	ErrInvalidConfig = errors.New("gpusim: invalid config")
	// ErrClosed is returned by operations on a closed Instance or Fleet.
	ErrClosed = errors.New("gpusim: closed")
)
