package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// stubConfig is how a stub backend answers.
type stubConfig struct {
	// Prefill is the delay before the first SSE chunk of a stream.
	Prefill time.Duration
	// Gap is the delay between later SSE chunks.
	Gap time.Duration
	// Chunks is the number of SSE chunks before "data: [DONE]".
	Chunks int
}

// completion is the answer to a non-streamed request: a small OpenAI chat
// completion, written with its headers in one write.
var completion = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1024,"completion_tokens":1,"total_tokens":1025}}`)

var (
	completionResp = []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(completion)) + "\r\n\r\n" + string(completion))
	healthResp   = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")
	badResp      = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	notFoundResp = []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	sseHead      = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
	streamFlag   = []byte(`"stream":true`)
)

// Headers with which a request asks for a stream of its own length and
// pace (the open-streams phase), so one stub process serves every phase.
// A request that sets either gets timed events (timedEvent); the other
// keeps the stub's own setting.
const (
	gapHeader    = "X-Bench-Gap"    // a Go duration, 0 to maxBenchGap
	chunksHeader = "X-Bench-Chunks" // 1 to maxBenchChunks events before [DONE]
)

// Bounds of what a request may ask for: a stream lasts at most about
// maxBenchChunks x maxBenchGap.
const (
	maxBenchGap    = 10 * time.Second
	maxBenchChunks = 10000
)

// sseChunk renders SSE event i as one HTTP chunk.
func sseChunk(dst []byte, i int) []byte {
	ev := fmt.Sprintf("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
	return fmt.Appendf(dst, "%x\r\n%s\r\n", len(ev), ev)
}

var sseDone = []byte("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")

// timedEvent appends SSE event i of a timed stream: an OpenAI
// chat.completion.chunk (about 190 bytes) whose "t" field is the time it
// is sent, in Unix nanoseconds, for the client to measure each event's
// one-way latency (parseEventTime).
func timedEvent(dst []byte, i int, sent int64) []byte {
	dst = append(dst, `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench","t":`...)
	dst = strconv.AppendInt(dst, sent, 10)
	dst = append(dst, `,"choices":[{"index":0,"delta":{"content":" tok`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	return append(dst, "\"},\"finish_reason\":null}]}\n\n"...)
}

// appendChunk appends data as one HTTP/1.1 chunk.
func appendChunk(dst, data []byte) []byte {
	dst = strconv.AppendInt(dst, int64(len(data)), 16)
	dst = append(dst, "\r\n"...)
	dst = append(dst, data...)
	return append(dst, "\r\n"...)
}

// serveStub answers HTTP/1.1 requests on ln until ctx ends. It is a
// deliberately small server (one goroutine per connection, canned answers)
// so the load generator's core spends little on it.
func serveStub(ctx context.Context, ln net.Listener, cfg stubConfig) error {
	var wg sync.WaitGroup
	conns := map[net.Conn]struct{}{}
	var mu sync.Mutex
	go func() {
		<-ctx.Done()
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveStubConn(ctx, c, cfg)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		}()
	}
}

// stubReadBuffer holds a request's head and a default 4 KiB body in one
// read, and stays small when thousands of streams are open at once.
const stubReadBuffer = 8 << 10

func serveStubConn(ctx context.Context, c net.Conn, cfg stubConfig) {
	br := bufio.NewReaderSize(c, stubReadBuffer)
	var body []byte
	var out, ev []byte
	for {
		h, err := readHead(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.Write(badResp)
			}
			return
		}
		method, path, clen := h.method, h.path, h.clen
		if clen > 0 {
			if cap(body) < clen {
				body = make([]byte, clen)
			}
			body = body[:clen]
			if _, err := io.ReadFull(br, body); err != nil {
				return
			}
		} else {
			body = body[:0]
		}
		switch {
		case method == "GET" && (path == "/health" || path == "/ping"):
			_, err = c.Write(healthResp)
		case method != "POST":
			_, err = c.Write(notFoundResp)
		case bytes.Contains(body, streamFlag) && h.timed():
			out, ev, err = timedStream(ctx, c, h.spec(cfg), out, ev)
		case bytes.Contains(body, streamFlag):
			out, err = stream(ctx, c, cfg, out, h.together)
		default:
			_, err = c.Write(completionResp)
		}
		if err != nil {
			return
		}
	}
}

// headersHeader asks the stub to send a stream's headers together with its
// first event (as Go's net/http does on the first Flush) instead of at once
// (as uvicorn does for vLLM and SGLang when a streaming response starts).
const headersHeader = "X-Bench-Headers"

// stream writes the SSE headers, then the chunks.
func stream(ctx context.Context, c net.Conn, cfg stubConfig, buf []byte, together bool) ([]byte, error) {
	if !together {
		if _, err := c.Write(sseHead); err != nil {
			return buf, err
		}
	}
	t := time.NewTimer(cfg.Prefill)
	defer t.Stop()
	for i := 0; i < cfg.Chunks; i++ {
		d := cfg.Gap
		if i == 0 {
			d = cfg.Prefill
		}
		if d > 0 {
			t.Reset(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				return buf, ctx.Err()
			}
		}
		buf = buf[:0]
		if together && i == 0 {
			buf = append(buf, sseHead...)
		}
		buf = sseChunk(buf, i)
		if _, err := c.Write(buf); err != nil {
			return buf, err
		}
	}
	_, err := c.Write(sseDone)
	return buf, err
}

// timedStream writes the SSE headers at once, then spec.Chunks timed
// events (the first after spec.Prefill, the others spec.Gap after the
// previous one), one write each, then [DONE].
func timedStream(ctx context.Context, c net.Conn, spec stubConfig, buf, ev []byte) ([]byte, []byte, error) {
	if _, err := c.Write(sseHead); err != nil {
		return buf, ev, err
	}
	t := time.NewTimer(spec.Prefill)
	defer t.Stop()
	for i := 0; i < spec.Chunks; i++ {
		if i > 0 {
			t.Reset(spec.Gap)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return buf, ev, ctx.Err()
		}
		ev = timedEvent(ev[:0], i, time.Now().UnixNano())
		buf = appendChunk(buf[:0], ev)
		if _, err := c.Write(buf); err != nil {
			return buf, ev, err
		}
	}
	_, err := c.Write(sseDone)
	return buf, ev, err
}

var errBadRequest = errors.New("bad request")

// reqHead is what the stub reads of a request's head.
type reqHead struct {
	method, path string
	clen         int
	// together: headersHeader asks for headers with the first event.
	together bool
	// gap and chunks are gapHeader and chunksHeader, when set (gapSet,
	// chunks > 0).
	gap    time.Duration
	gapSet bool
	chunks int
}

// timed reports whether the request asked for a stream of its own.
func (h reqHead) timed() bool { return h.gapSet || h.chunks > 0 }

// spec is the stub's stream settings with the request's own in place.
func (h reqHead) spec(cfg stubConfig) stubConfig {
	if h.gapSet {
		cfg.Gap = h.gap
	}
	if h.chunks > 0 {
		cfg.Chunks = h.chunks
	}
	return cfg
}

// readHead reads a request line and headers. Chunked request bodies, a
// Content-Length over 64 MiB, and a gap or chunk count out of bounds are
// refused.
func readHead(br *bufio.Reader) (reqHead, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if len(line) == 0 {
			return reqHead{}, io.EOF
		}
		return reqHead{}, err
	}
	f := bytes.Fields(line)
	if len(f) != 3 {
		return reqHead{}, errBadRequest
	}
	out := reqHead{method: string(f[0]), path: string(f[1])}
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return reqHead{}, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			return out, nil
		}
		k, v, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			return reqHead{}, errBadRequest
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 0 || n > 64<<20 {
				return reqHead{}, errBadRequest
			}
			out.clen = n
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			return reqHead{}, errBadRequest
		case bytes.EqualFold(k, []byte(headersHeader)):
			out.together = bytes.Equal(v, []byte("with-first-event"))
		case bytes.EqualFold(k, []byte(gapHeader)):
			d, err := time.ParseDuration(string(v))
			if err != nil || d < 0 || d > maxBenchGap {
				return reqHead{}, errBadRequest
			}
			out.gap, out.gapSet = d, true
		case bytes.EqualFold(k, []byte(chunksHeader)):
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 1 || n > maxBenchChunks {
				return reqHead{}, errBadRequest
			}
			out.chunks = n
		}
	}
}
