// Command benchproxy measures warmroute's request path side by side with
// HAProxy on one machine, in one run, under the same load.
//
// It starts fast stub backends (this same binary, "benchproxy stub"),
// HAProxy from a generated config (balance hash req.body,bytes(0,N),
// hash-type consistent, hash-balance-factor: body-prefix affinity with
// bounded loads) and `warmroute serve`, all on loopback. wrk drives each
// target, and the stubs directly, with the same 4 KiB OpenAI-style bodies
// (64 shared prefixes) at concurrency 1 and 64. The system under test is
// pinned to one core and the load generator and stubs to the other. For
// every target it reports requests per second, p50/p99 latency, the
// proxy's CPU time per request (utime+stime from /proc/<pid>/stat) and the
// warmroute/HAProxy ratios; then the time to the first SSE chunk of a
// 50-chunk stream through each proxy against a direct call.
//
// The open-streams phase (-phases open; openstreams.go) holds N long SSE
// streams open at once, as LLM streaming does: 61 events 300 ms apart
// each, started over 3 s, on a connection each, through a fresh proxy
// process per run. Every event carries the stub's send time, so the client
// measures each event's one-way latency. While every stream is open it
// reads the proxy's CPU time per relayed event and its RSS (and, for
// warmroute, Go heap) per open stream over its idle figure; after the
// streams end it watches how much of that memory the process returns.
// Each proxy run also reports its whole-life CPU per event: from just
// before the first request to just after the last stream ended. With
// -open-engine gpusim (engine.go) the streams come from warmroute's own
// gpusim processes instead of the stub (vLLM's chunk shape, the finish
// reason and usage chunks, its /metrics); their events are counted, not
// timed.
//
// The long-prompt phase (-phases long; long.go; not run unless named)
// sends chat bodies of -long-sizes bytes (400,000, about 100k tokens, and
// 8,192) at a fixed rate to each target, open loop, and reports the
// proxy's CPU per request (and cores per 100 requests/s), the latency it
// adds to a direct call, and its peak RSS.
//
// Repetitions are interleaved (direct, HAProxy, warmroute, then again) so
// ratios come from the same conditions, and the summary gives the median
// and the spread over repetitions. Every child runs in its own process
// group, dies with the harness (Pdeathsig), and is stopped on exit or on
// SIGINT/SIGTERM; the whole run is bounded by --timeout.
//
// scripts/bench-proxy.sh (make bench-proxy) installs HAProxy and wrk with
// apt-get when they are missing, builds warmroute and runs this command.
package main
