// Package kvmetrics reads an inference engine's prefix-cache counters from
// its Prometheus text exposition (/metrics): hit tokens and queried tokens,
// summed over every series. The hit rate of a window is the ratio of their
// increases (see stats.HitRate).
//
// Recognised names, newest first: vLLM V1 vllm:prefix_cache_hits_total and
// vllm:prefix_cache_queries_total; early V1 vllm:gpu_prefix_cache_hits_total
// and vllm:gpu_prefix_cache_queries_total (each with or without the _total
// suffix, as client libraries differ in how they name counter families).
//
// ParsePredictions reads a warmroute router's own counts of the cache
// predictions it made against what the answers delivered
// (warmroute_cache_*_total), per decision kind.
package kvmetrics
