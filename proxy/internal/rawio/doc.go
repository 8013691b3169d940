// Package rawio does a TCP connection's reads and writes itself, with raw
// system calls through syscall.RawConn callbacks, for the proxy's request
// path.
//
// Go's net package enters the scheduler's syscall state around every read
// and write; with one thread per core (GOMAXPROCS 1 on a pinned process) the
// runtime's monitor then hands the processor to another thread whenever a
// loopback write takes a little long, and threads wake each other several
// times per request. Socket I/O here is non-blocking and never sleeps in the
// kernel (the wait for readiness is the runtime poller's, as in the net
// package), so raw calls are safe and keep the request on one thread.
//
// The package offers:
//
//   - Socket: recv and send on a connection's descriptor; read deadlines
//     handed to the runtime poller only when a read is about to wait
//     (SetReadDeadline); a bound on how long a write may wait for room
//     without progress; a hook that runs once before a read waits (OnBlock);
//     and PeerClosed, the check that an idle connection is still open.
//   - DeferredWrite: a Socket that holds back the last write of a request and
//     makes it inside the first read of the answer, saving two system calls
//     per exchange.
//   - PeerClosed: the same idle-connection check for any connection with a
//     descriptor, on every unix system.
//
// Socket and DeferredWrite are implemented on Linux. Elsewhere NewSocket and
// NewDeferredWrite return nil and the caller uses its connection as it is;
// PeerClosed works on every unix system and reports false (cannot tell)
// elsewhere.
//
// Reads and writes allocate nothing: the callbacks are method values bound
// once per connection. A Socket belongs to the one goroutine that reads and
// writes its connection; only PollerChanged may be called from another.
package rawio
