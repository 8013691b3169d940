package gpusim

import (
	"math"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counters is the instance's running totals, written by the engine and the
// handlers and read by /metrics and /admin/stats. Counters only grow.
type counters struct {
	promptTokens     atomic.Uint64
	generationTokens atomic.Uint64
	cacheQueries     atomic.Uint64 // prompt tokens looked up in the prefix cache
	cacheHits        atomic.Uint64 // of which found cached
	successStop      atomic.Uint64
	successLength    atomic.Uint64
	aborted          atomic.Uint64
	failed           atomic.Uint64
	stalled          atomic.Uint64
	loraLoads        atomic.Uint64 // adapters read from disk into host memory
	loraSwaps        atomic.Uint64 // adapters copied into a GPU slot

	// Gauges published by the engine after every event.
	running        atomic.Int64
	waiting        atomic.Int64
	kvUsage        atomic.Uint64 // float64 bits
	kvUsedBlocks   atomic.Int64
	kvCachedBlocks atomic.Int64
	kvEvictions    atomic.Uint64
	// lora is the adapters running and waiting, and loraAt when the
	// engine last published them (float64 bits of Unix seconds).
	lora   atomic.Pointer[loraInfo]
	loraAt atomic.Uint64
}

// metrics holds the instance's own Prometheus registry. Metric names, types,
// labels and histogram buckets follow vLLM V1 (vllm/v1/metrics/loggers.py).
type metrics struct {
	reg   *prometheus.Registry
	ttft  prometheus.Histogram
	itl   prometheus.Histogram
	e2e   prometheus.Histogram
	queue prometheus.Histogram
}

// vLLM V1 histogram buckets (functions, so no package state can change).
func ttftBuckets() []float64 {
	return []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
}

func itlBuckets() []float64 {
	return []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
}

func requestLatencyBuckets() []float64 {
	return []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
}

func newMetrics(cfg *Config, c *counters) *metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": cfg.Model, "engine": "0"}
	with := func(extra ...string) prometheus.Labels {
		l := prometheus.Labels{}
		for k, v := range labels {
			l[k] = v
		}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}
	counter := func(name, help string, l prometheus.Labels, v *atomic.Uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l},
			func() float64 { return float64(v.Load()) }))
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}

	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func() float64 { return float64(c.running.Load()) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func() float64 { return float64(c.waiting.Load()) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
		func() float64 { return math.Float64frombits(c.kvUsage.Load()) })
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", labels, &c.cacheQueries)
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", labels, &c.cacheHits)
	counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", labels, &c.promptTokens)
	counter("vllm:generation_tokens_total", "Number of generation tokens processed.", labels, &c.generationTokens)
	var never atomic.Uint64 // aborted requests are not successes
	for reason, v := range map[string]*atomic.Uint64{"stop": &c.successStop, "length": &c.successLength, "abort": &never} {
		counter("vllm:request_success_total", "Count of successfully processed requests.", with("finished_reason", reason), v)
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"engine": "0", "block_size": strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks": strconv.Itoa(cfg.KVCacheBlocks), "enable_prefix_caching": "True",
		},
	}, func() float64 { return 1 }))

	counter("gpusim_requests_aborted_total", "Requests abandoned by their client before the last token.", nil, &c.aborted)
	counter("gpusim_requests_failed_total", "Requests answered with an injected 500.", nil, &c.failed)
	counter("gpusim_requests_stalled_total", "Requests delayed by an injected stall.", nil, &c.stalled)
	counter("gpusim_kv_evicted_blocks_total", "Cached KV blocks evicted to make room.", nil, &c.kvEvictions)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpusim_kv_cached_blocks", Help: "KV blocks holding a cached prefix (held or free).",
	}, func() float64 { return float64(c.kvCachedBlocks.Load()) }))
	counter("gpusim_lora_loads_total", "LoRA adapters read from disk into host memory.", nil, &c.loraLoads)
	counter("gpusim_lora_swaps_total", "LoRA adapters copied from host memory into a GPU slot.", nil, &c.loraSwaps)
	if cfg.EnableLoRA {
		reg.MustRegister(&loraCollector{c: c, maxLoRA: strconv.Itoa(cfg.MaxLoRAs)})
	}

	return &metrics{
		reg:   reg,
		ttft:  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets()),
		itl:   hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets()),
		e2e:   hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestLatencyBuckets()),
		queue: hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets()),
	}
}

// loraCollector exports vllm:lora_requests_info as vLLM does: a gauge
// whose labels name the adapters of the running and the waiting requests
// (comma-separated) and the GPU slots (max_lora), and whose value is when
// they were last updated (Unix seconds). vLLM keeps a series for every
// combination of labels it ever set, and readers take the newest by its
// value; gpusim exports the newest alone, so its memory stays bounded.
type loraCollector struct {
	c       *counters
	maxLoRA string
}

func loraInfoDesc() *prometheus.Desc {
	return prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
		[]string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"}, nil)
}

// Describe implements prometheus.Collector.
func (l *loraCollector) Describe(ch chan<- *prometheus.Desc) { ch <- loraInfoDesc() }

// Collect implements prometheus.Collector.
func (l *loraCollector) Collect(ch chan<- prometheus.Metric) {
	info := l.c.lora.Load()
	if info == nil {
		info = &loraInfo{}
	}
	ch <- prometheus.MustNewConstMetric(loraInfoDesc(), prometheus.GaugeValue,
		math.Float64frombits(l.c.loraAt.Load()), l.maxLoRA, info.waiting, info.running)
}
