// Package reqlog writes what a router saw of each request, off the
// request path: an access log line (JSON or text) and a trace record in
// Mooncake's JSONL format (loadtest/trace), which `warmroute loadtest
// --trace` and `warmroute trace bounds` replay.
//
// The request path takes a Record from a fixed free list (Begin), fills it
// in place and hands it back (Submit); one goroutine, started by New and
// stopped by Close, formats and writes it and returns it to the free list.
// Nothing allocates per request and nothing blocks: when every record is
// in use (the writer fell behind), Begin returns nil and the request is
// counted in warmroute_request_log_dropped_total instead.
//
// A Record holds no prompt text: the model name (cut at MaxModelBytes),
// a hash of the tenant, the digests of the canonical prompt's 1 KiB
// blocks (ring.KeyInfo's chain, mixed with the model and tenant), token
// counts and timings.
package reqlog
