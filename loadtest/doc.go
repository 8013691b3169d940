// Package loadtest drives an OpenAI-compatible endpoint (a warmroute router,
// one backend, or another router) with a workload and measures what prefix-
// aware routing changes: time-to-first-token, inter-token and end-to-end
// latency, throughput, errors, the traffic share of each backend, the
// router's decisions and the backends' KV-cache hit rate.
//
// Two arrival models:
//
//   - open loop: Poisson arrivals at a target rate. Latency is measured from
//     each request's intended send time, so a slow target cannot slow the
//     generator down and hide its own queueing (no coordinated omission).
//   - closed loop: a fixed number of workers, each sending its next request
//     when the previous one finishes.
//
// The KV-cache hit rate is hit tokens / queried tokens between the start and
// the end of the run, from the backends' vLLM counters; the traffic share
// comes from the router's X-Warmroute-Backend response header (falling back
// to gpusim's X-Gpusim-Instance when a backend is driven directly). With
// the routers' admin /metrics (RouterMetricsURLs), their own count of the
// cache predictions they made against what the answers delivered, per
// decision kind, over the measured window (Summary.Predictions).
//
// Subpackages: workload (request generators), stats (arithmetic), kvmetrics
// (counter parsing), report (table, JSON, HTML), fleet (a local fleet as
// child processes), compare (the same workloads under several strategies,
// each against a cold fleet), gpusim (the simulated backend), proc (child
// process supervision), soak (a bounded soak test of one router), chaos
// (faults injected into a cluster under load) and the benchproxy command
// (warmroute against HAProxy). loadtest talks to routers and backends over
// HTTP only. docs/loadtest.md describes the figures and the demo.
package loadtest
