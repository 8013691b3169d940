// Package engine reads what an inference engine says about itself: KV-cache
// usage, running and waiting requests and prefix-cache hit rate, from the
// Prometheus text exposition its /metrics endpoint serves.
//
// Parser maps metric names to those figures (Mapping; DefaultMapping knows
// vLLM V1, vLLM V0 and early V1, SGLang and TGI) and sums them over label
// sets, so an instance serving several engines or models reports one
// figure per backend. It is a single pass over the body that skips
// unrelated lines without allocating.
//
// Scraper scrapes, about every second, the backends this router node owns
// (the cluster assigns each backend to one node) and hands each result to
// a callback; the node shares them with the other nodes. The prefix-cache
// hit rate of engines that export hit and query counters (vLLM V1) is
// computed from their growth over a sliding window. Trigger asks for a
// scrape of one backend before the next round: the proxy does when the
// cluster's in-flight count on it passes the highest level seen without a
// queue, so that a queue forming between rounds is seen at once.
package engine
