package gpusim

import (
	"context"
	"net/http"
	"strconv"
)

// response writes one request's answer, streamed or whole, as tokens come
// out of the engine. The JSON is appended by hand: it has a fixed shape and
// this is the per-token hot path.
type response struct {
	in      *Instance
	p       *parsedRequest
	s       *seq
	id      string
	created int64
}

func (rs *response) finishReason() string {
	if rs.s.limited {
		return "length"
	}
	return "stop"
}

// appendBase appends `{"id":..,"object":..,"created":..,"model":..,`.
func (rs *response) appendBase(dst []byte, object string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, rs.id...)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, rs.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, rs.p.modelJSON...)
	return append(dst, ',')
}

func (rs *response) appendUsage(dst []byte) []byte {
	p, c := rs.s.shape.tokens, rs.s.maxTokens
	dst = append(dst, `"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p+c), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(rs.s.cachedTokens), 10)
	return append(dst, `}}`...)
}

// waitToken blocks until the engine emits a token. If the client or the
// instance goes away first it withdraws the request and drops the
// connection (http.ErrAbortHandler), so that a response cut short by a
// closing instance reaches its client as an error, not as a short answer.
func (rs *response) waitToken(ctx context.Context) {
	select {
	case <-rs.s.tokens:
		return
	case <-ctx.Done():
	case <-rs.in.closing:
	}
	rs.in.eng.abort(rs.s)
	panic(http.ErrAbortHandler)
}

// stream writes Server-Sent Events as vLLM does: for chat a first chunk
// with the assistant role, then chunks of tokens (the last carrying the
// finish_reason), an optional usage chunk, and "data: [DONE]". The first
// token goes out at once, later ones every StreamInterval tokens; tokens
// that pile up while the client reads slowly are merged into one chunk.
// gather waits for the next token and takes those already generated: got
// tokens so far, sent of them streamed. It returns the new count and
// whether a chunk is due (the first, every interval tokens, and the last).
func (rs *response) gather(ctx context.Context, got, sent, interval int) (int, bool) {
	total := rs.s.maxTokens
	rs.waitToken(ctx)
	got++
drain:
	for got < total {
		select {
		case <-rs.s.tokens:
			got++
		default:
			break drain
		}
	}
	return got, sent == 0 || got >= total || got-sent >= interval
}

func (rs *response) stream(ctx context.Context, w http.ResponseWriter) {
	if rs.p.resp != nil {
		rs.streamResponses(ctx, w)
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		rs.in.eng.abort(rs.s)
		return
	}
	object := "text_completion"
	if rs.p.chat {
		object = "chat.completion.chunk"
	}
	head := append([]byte("data: "), rs.appendBase(nil, object)...)
	head = append(head, `"choices":[{"index":0,`...)
	total, interval := rs.s.maxTokens, rs.in.cfg.StreamInterval
	buf := make([]byte, 0, 1024)
	got, sent := 0, 0
	for got < total {
		var due bool
		if got, due = rs.gather(ctx, got, sent, interval); !due {
			continue
		}
		buf = buf[:0]
		if sent == 0 && rs.p.chat {
			buf = append(buf, head...)
			buf = append(buf, `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		buf = append(buf, head...)
		if rs.p.chat {
			buf = append(buf, `"delta":{"content":"`...)
		} else {
			buf = append(buf, `"text":"`...)
		}
		for ; sent < got; sent++ {
			buf = append(buf, rs.in.fill.token(rs.s.shape.seed, sent)...)
		}
		if rs.p.chat {
			buf = append(buf, `"},"logprobs":null,"finish_reason":`...)
		} else {
			buf = append(buf, `","logprobs":null,"finish_reason":`...)
		}
		switch {
		case got == total:
			buf = append(buf, '"')
			buf = append(buf, rs.finishReason()...)
			buf = append(buf, `","stop_reason":null}]}`+"\n\n"...)
			if rs.p.includeUsage {
				buf = append(buf, "data: "...)
				buf = rs.appendBase(buf, object)
				buf = append(buf, `"choices":[],`...)
				buf = rs.appendUsage(buf)
				buf = append(buf, "}\n\n"...)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		case rs.p.chat:
			buf = append(buf, `null}]}`+"\n\n"...)
		default:
			buf = append(buf, `null,"stop_reason":null}]}`+"\n\n"...)
		}
		if _, err := w.Write(buf); err != nil || rc.Flush() != nil {
			if got < total {
				rs.in.eng.abort(rs.s)
			}
			return
		}
	}
}

// full waits for the whole generation and writes one JSON response.
func (rs *response) full(ctx context.Context, w http.ResponseWriter) {
	if rs.p.resp != nil {
		rs.fullResponses(ctx, w)
		return
	}
	for i := 0; i < rs.s.maxTokens; i++ {
		rs.waitToken(ctx)
	}
	buf := make([]byte, 0, 512+rs.s.maxTokens*8)
	if rs.p.chat {
		buf = rs.appendBase(buf, "chat.completion")
		buf = append(buf, `"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	} else {
		buf = rs.appendBase(buf, "text_completion")
		buf = append(buf, `"choices":[{"index":0,"text":"`...)
	}
	for i := 0; i < rs.s.maxTokens; i++ {
		buf = append(buf, rs.in.fill.token(rs.s.shape.seed, i)...)
	}
	if rs.p.chat {
		buf = append(buf, `","tool_calls":[]},"logprobs":null,"finish_reason":"`...)
	} else {
		buf = append(buf, `","logprobs":null,"finish_reason":"`...)
	}
	buf = append(buf, rs.finishReason()...)
	buf = append(buf, `","stop_reason":null}],`...)
	buf = rs.appendUsage(buf)
	buf = append(buf, `}`...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(buf)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf)
}
