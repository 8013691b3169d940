// Package relay passes the bodies of streamed answers (server-sent events
// from an inference engine) from upstream sockets to client sockets on a few
// event loops, so an open stream costs a small struct and the kernel's
// socket buffers instead of a goroutine, its stack and its read and write
// buffers.
//
// A stream enters the relay after its headers were exchanged: the proxy
// hands over both connections' descriptors (Detach), the answer's header
// bytes for the client and any body bytes already read from the upstream.
// A loop then waits for the upstream (an epoll set of its own, whose
// descriptor the runtime poller watches, so an idle loop is a parked
// goroutine and no thread blocks in epoll_wait), reads what came, checks the
// chunked framing (Decoder: every size and line bounded; the upstream may be
// hostile), passes the body bytes to the stream's Observer and writes them
// to the client as one chunk per read: one read and one write per event the
// engine sends, and the wait shared by every stream of the loop.
//
// A client that stops reading gets its bytes held (only then is memory
// allocated for the stream) while its upstream is not read: backpressure
// travels to the engine as it would through a blocking copy. A client that
// closes, or stalls longer than Config.WriteStall, ends the stream and the
// upstream connection with it, so the engine stops generating. An upstream
// that closes early, breaks the framing or stays silent longer than
// Config.UpstreamIdle ends the stream too: between two events an error
// event (Config.ErrorEvent) and a clean end go to the client, inside an
// event the client connection is cut. When the body ended, the client's
// descriptor is given back to the caller (Result.Client) to serve its next
// request; so is the upstream's (Result.Up) when the caller said it may
// carry another request (Spec.KeepUp) and its body ended exactly at the
// last chunk, for the caller to keep as an idle connection (Quiet checks
// one before reuse).
//
// Loops run on Linux; elsewhere New returns nil and the caller keeps its
// goroutine per stream.
package relay
