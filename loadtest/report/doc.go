// Package report renders load-test results: a text table for the terminal,
// JSON for tools, and a self-contained HTML page (inline SVG, no scripts or
// external files) with the TTFT distribution per strategy, the traffic
// share per instance and the KV-cache hit rate over time, and the routers'
// cache predictions against what was delivered, per decision kind.
package report
