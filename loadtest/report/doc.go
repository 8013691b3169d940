// Package report renders load-test results: a text table for the terminal,
// JSON for tools, and a self-contained HTML page (inline SVG, no scripts or
// external files) that opens with a verdict (what PREFIX_AWARE bought
// against every other strategy run, in time to first token and in prompt
// tokens not recomputed), names the build and the engines, and then gives
// per workload the figures, the TTFT distribution per strategy, the
// traffic share per instance, the KV-cache hit rate over time and the
// routers' cache predictions against what was delivered, per decision
// kind. The page is laid out to fit a screen 1,400 pixels wide.
package report
