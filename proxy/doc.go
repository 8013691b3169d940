// Package proxy is the request path of a router node: a fasthttp server that
// reads the routing key of each LLM request (ring.Extract), asks the current
// ring snapshot for a backend (ring.Ring.Pick) and streams the backend's
// response back unbuffered.
//
// It owns one pooled fasthttp.HostClient and a set of atomic counters per
// backend: own in-flight (from send to the end of the stream), the remote
// in-flight the cluster reports (SetRemote), engine busy flags, active-probe
// health and passive ejection after consecutive connect failures. A request
// reads only atomics and one atomic.Pointer to the current table; it takes
// no lock.
//
// Every attempt to forward a request takes one upstream step (upstream.go)
// whichever way its answer is then passed on (read whole, streamed by the
// request's goroutine, or on the relay): the request line, Host and
// traceparent for the backend, the send, and the checks on the answer's
// head; the hop-by-hop fields are removed once per request before it.
//
// It retries on another backend only when a request never reached one
// (connect refused or timed out, or no free connection); never once bytes
// were sent, since LLM POSTs are not idempotent. A client that goes away
// mid-stream closes the upstream connection so the engine stops generating,
// and is counted. Errors are OpenAI-style JSON.
//
// On Linux, a streamed answer passes on the relay's event loops
// (internal/relay) once its headers are known, without a goroutine or
// buffers of its own (relay.go). Its request goes out on an idle
// connection an earlier relayed stream left to the backend when there is
// one (relaypool.go: kept after a body that ended cleanly, at most 64 per
// backend, checked before reuse, closed after IdleConnTimeout), so the
// stream's first event does not wait for a connect.
//
// On Linux, client and upstream sockets are read and written with raw
// system calls (internal/rawio): no thread hand-offs around socket I/O, the
// request written with the first read of its answer, read deadlines handed
// to the poller only when a read waits. Elsewhere the connections are used
// as they are.
//
// Pick (picker.go) is the same decision for a gateway that forwards
// requests itself and asks only where each goes (proxy/extproc, the
// endpoint picker): keyed, narrowed to the model's table and to a subset
// hint, picked and held in flight as here, with the backends a retry would
// try listed as fallbacks.
//
// The package knows nothing of gossip or Raft: the node feeds it ring
// snapshots (SetRing) and remote figures (SetRemote) and reads its own
// counters (AppendInFlight).
package proxy
