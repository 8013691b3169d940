// Package stats holds the arithmetic of a load test: latency histograms
// (HDR, so percentiles keep three significant digits from microseconds to
// minutes), throughput, errors by kind, traffic share per backend, router
// decisions, the KV-cache hit rate computed from counter deltas, and two
// offline references for that hit rate computed from the requests sent
// (Bounds: an infinite cache, and the fleet's finite caches under perfect
// prefix affinity), and the routers' cache predictions against what was
// delivered per decision kind (Prediction, from their own counters).
//
// A Recorder is fed one Outcome per request from many goroutines and turns
// into a Summary, the JSON-ready result of one run.
package stats
