// Package extproc makes a router the endpoint picker (EPP) of a Gateway
// API Inference Extension InferencePool: it serves Envoy's external
// processing protocol (envoy.service.ext_proc.v3.ExternalProcessor/Process)
// and answers each request with the endpoint the router's own decision
// path picks (proxy.Proxy.Pick), instead of forwarding the request itself.
//
// The contract, from the extension's protocol proposal 004 and its
// reference pickers:
//
//   - Request headers, then the body. With FULL_DUPLEX_STREAMED (what the
//     reference gateways configure) the picker holds the body's chunks
//     until it has the whole JSON document (the model and stream fields may
//     come after the prompt, so the key needs all of it), picks, and
//     answers headers, body (the chunks re-emitted as StreamedBodyResponse,
//     at most 62 KiB each) and trailers, in that order. With BUFFERED the
//     headers are answered at once and the decision rides on the body's
//     answer. A request without a body (headers with end_of_stream) is
//     picked at once. STREAMED is refused: its header answer must precede
//     the body, so the pick could not see the prompt.
//   - An optional subset: filter_metadata["envoy.lb.subset_hint"]
//     ["x-gateway-destination-endpoint-subset"], a list of "ip:port" or one
//     comma-separated string. The pick comes from it or is a 503.
//   - The answer: the request header x-gateway-destination-endpoint
//     ("ip:port[,ip:port...]", primary first, then fallbacks in the order
//     the HTTP path would retry) and the same value in dynamic_metadata
//     ["envoy.lb"]["x-gateway-destination-endpoint"], with
//     clear_route_cache. The header overwrites one a client sent.
//   - ImmediateResponse 503 when no endpoint can take the request, 429 when
//     it is shed (too many streams, or no room for its body in the router's
//     body memory), 400/404/408/413 for what the HTTP path answers so.
//   - Response headers carry the endpoint that served in metadata_context
//     ["envoy.lb"]["x-gateway-destination-endpoint-served"]: the in-flight
//     slot moves to it, and its usage (cached tokens) is read from the
//     response body as it passes, as the HTTP proxy reads it.
//
// Each stream holds an in-flight slot of its backend from the pick to the
// stream's end, counted and gossiped like the HTTP path's.
//
// Bounds: concurrent streams (over them, 429 at the first message),
// message size, body bytes (max-body-size, and the shared body-memory
// budget), the request phase (read-timeout, 408), the wait for the answer
// (first-byte-timeout) and between its pieces (stream-idle-timeout). The
// listener's connection caps are the caller's (node wraps it).
//
// Health: the gRPC health service answers for "liveness" (serving while
// the process runs), and for "readiness", "" , the ext_proc service name
// and "inference-extension" (serving once the router routes on an agreed
// state with a backend that can take requests).
package extproc
