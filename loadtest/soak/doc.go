// Package soak runs a bounded soak test of one warmroute router: steady
// mixed load (streamed and complete chat, completions, malformed requests,
// clients that abort a stream after its first event) through a router in
// front of gpusim instances that are killed and restarted periodically,
// while the router's own /metrics (go_goroutines,
// go_memstats_heap_inuse_bytes, process_resident_memory_bytes) are sampled.
//
// Run starts the processes (`warmroute serve`, one `warmroute gpusim` per
// backend, each restarted on its own port), warms up, measures an idle
// baseline, loads for Config.Duration, lets the router go idle again and
// returns a Report: the sampled curve and the verdicts of the pass
// criteria (see Report.Check). Everything listens on 127.0.0.1 and every
// loop is bounded in time. The router runs with cluster TLS, as deployed (a
// CA and certificate made for the run), so its admin API, where the
// samples come from, serves HTTPS.
//
// `make soak` runs about 10 minutes (scripts/soak.sh); `go test
// ./loadtest/soak` runs a short version.
package soak
