package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
)

// Minimal, allocation-free HTTP/1.1 pieces for tests that count the
// request path's allocations: a stub backend and a keep-alive client. They
// understand just what they exchange with the proxy.

var (
	rawAnswer = []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 48\r\n\r\n" +
		`{"object":"chat.completion","choices":[],"n":1}` + "\n")
	rawSSEHead   = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	rawSSEChunks = chunked("data: {\"t\":1}\n\n", "data: {\"t\":2}\n\n", "data: [DONE]\n\n")
	crlfcrlf     = []byte("\r\n\r\n")
	hdrCL        = []byte("\ncontent-length:")
	hdrChunked   = []byte("transfer-encoding: chunked")
	streamTrue   = []byte(`"stream":true`)
)

// chunked frames events as HTTP/1.1 chunks, one each, and the last chunk.
func chunked(events ...string) []byte {
	var b []byte
	for _, e := range events {
		b = fmt.Appendf(b, "%x\r\n%s\r\n", len(e), e)
	}
	return append(b, "0\r\n\r\n"...)
}

// readMessage reads one HTTP message head and its body (Content-Length or
// chunked) from br into buf and returns the head and body; they alias buf.
func readMessage(br *bufio.Reader, buf []byte) (head, body []byte, err error) {
	buf = buf[:0]
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, nil, err
		}
		buf = append(buf, line...)
		if len(line) <= 2 && bytes.HasSuffix(buf, crlfcrlf) {
			break
		}
	}
	head = buf
	lower := buf[len(buf):]
	for _, c := range head {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower = append(lower, c)
	}
	if bytes.Contains(lower, hdrChunked) {
		start := len(lower) + len(head)
		buf = buf[:start]
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return nil, nil, err
			}
			n := 0
			for _, c := range line {
				switch {
				case '0' <= c && c <= '9':
					n = n*16 + int(c-'0')
				case 'a' <= c && c <= 'f':
					n = n*16 + int(c-'a'+10)
				}
				if c == '\r' {
					break
				}
			}
			if n == 0 {
				if _, err := br.Discard(2); err != nil {
					return nil, nil, err
				}
				return head, buf[start:], nil
			}
			for i := 0; i < n+2; i++ {
				c, err := br.ReadByte()
				if err != nil {
					return nil, nil, err
				}
				if i < n {
					buf = append(buf, c)
				}
			}
		}
	}
	i := bytes.Index(lower, hdrCL)
	if i < 0 {
		return head, nil, nil
	}
	n := 0
	for _, c := range lower[i+len(hdrCL):] {
		if c == ' ' {
			continue
		}
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	start := len(head) + len(lower)
	if cap(buf) < start+n {
		return nil, nil, errors.New("message too large for the buffer")
	}
	body = buf[start : start+n]
	_, err = io.ReadFull(br, body)
	return head, body, err
}

// rawStub is a backend answering every POST with rawAnswer, or with a short
// SSE stream when the body asks for one.
type rawStub struct {
	ln net.Listener
}

func newRawStub(t testing.TB) *rawStub {
	return &rawStub{ln: serveConns(t, func(c net.Conn) {
		br := bufio.NewReaderSize(c, 64<<10)
		buf := make([]byte, 0, 256<<10)
		for {
			_, body, err := readMessage(br, buf)
			if err != nil {
				return
			}
			if bytes.Contains(body, streamTrue) {
				if _, err := c.Write(rawSSEHead); err != nil {
					return
				}
				_, err = c.Write(rawSSEChunks)
			} else {
				_, err = c.Write(rawAnswer)
			}
			if err != nil {
				return
			}
		}
	})}
}

func (s *rawStub) url() string { return "http://" + s.ln.Addr().String() }

// rawClient sends one prepared request at a time over a keep-alive
// connection.
type rawClient struct {
	c   net.Conn
	br  *bufio.Reader
	buf []byte
}

func newRawClient(t testing.TB, addr string) *rawClient {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{c: c, br: bufio.NewReaderSize(c, 64<<10), buf: make([]byte, 0, 256<<10)}
}

// do writes req and returns the answer's head and body (aliasing the
// client's buffer).
func (r *rawClient) do(req []byte) (head, body []byte, err error) {
	if _, err := r.c.Write(req); err != nil {
		return nil, nil, err
	}
	return readMessage(r.br, r.buf)
}
