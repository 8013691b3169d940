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

// sseChunk renders SSE event i as one HTTP chunk.
func sseChunk(dst []byte, i int) []byte {
	ev := fmt.Sprintf("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
	return fmt.Appendf(dst, "%x\r\n%s\r\n", len(ev), ev)
}

var sseDone = []byte("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")

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

func serveStubConn(ctx context.Context, c net.Conn, cfg stubConfig) {
	br := bufio.NewReaderSize(c, 64<<10)
	var body []byte
	var out []byte
	for {
		method, path, clen, together, err := readHead(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.Write(badResp)
			}
			return
		}
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
		case bytes.Contains(body, streamFlag):
			out, err = stream(ctx, c, cfg, out, together)
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

var errBadRequest = errors.New("bad request")

// readHead reads a request line and headers and returns the method, the
// path, the Content-Length and whether headersHeader asks for headers
// together with the first event. Chunked request bodies are refused.
func readHead(br *bufio.Reader) (method, path string, clen int, together bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if len(line) == 0 {
			return "", "", 0, false, io.EOF
		}
		return "", "", 0, false, err
	}
	f := bytes.Fields(line)
	if len(f) != 3 {
		return "", "", 0, false, errBadRequest
	}
	method, path = string(f[0]), string(f[1])
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return "", "", 0, false, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			return method, path, clen, together, nil
		}
		k, v, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			return "", "", 0, false, errBadRequest
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 0 || n > 64<<20 {
				return "", "", 0, false, errBadRequest
			}
			clen = n
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			return "", "", 0, false, errBadRequest
		case bytes.EqualFold(k, []byte(headersHeader)):
			together = bytes.Equal(v, []byte("with-first-event"))
		}
	}
}
