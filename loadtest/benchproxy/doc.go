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
// Repetitions are interleaved (direct, HAProxy, warmroute, then again) so
// ratios come from the same conditions, and the summary gives the median
// and the spread over repetitions. Every child runs in its own process
// group, dies with the harness (Pdeathsig), and is stopped on exit or on
// SIGINT/SIGTERM; the whole run is bounded by --timeout.
//
// scripts/bench-proxy.sh (make bench-proxy) installs HAProxy and wrk with
// apt-get when they are missing, builds warmroute and runs this command.
package main
