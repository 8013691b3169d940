package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// streamClient sends streamed chat requests over one keep-alive
// connection and times the first SSE event. It speaks just enough HTTP/1.1
// for the stubs' answers passed through a proxy: a 200 with a chunked
// body.
type streamClient struct {
	addr string
	conn net.Conn
	br   *bufio.Reader
}

func newStreamClient(addr string) *streamClient { return &streamClient{addr: addr} }

func (c *streamClient) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// streamTiming is one streamed request.
type streamTiming struct {
	// First is the time from writing the request to reading the first
	// byte of the first SSE event.
	First time.Duration
	// Total is the time to the end of the stream.
	Total time.Duration
	// Events is the number of data events, [DONE] included.
	Events int
}

// do sends one request and reads the whole stream. With together the stub
// is asked to send the headers with the first event.
func (c *streamClient) do(body []byte, together bool, timeout time.Duration) (streamTiming, error) {
	var t streamTiming
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, timeout)
		if err != nil {
			return t, err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 64<<10)
	}
	extra := ""
	if together {
		extra = headersHeader + ": with-first-event\r\n"
	}
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + c.addr +
		"\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	_ = c.conn.SetDeadline(time.Now().Add(timeout))
	start := time.Now()
	if _, err := c.conn.Write(append([]byte(req), body...)); err != nil {
		c.close()
		return t, err
	}
	status, chunked, err := c.readHead()
	if err != nil {
		c.close()
		return t, err
	}
	if status != 200 || !chunked {
		c.close()
		return t, fmt.Errorf("status %d, chunked %v", status, chunked)
	}
	for {
		data, err := c.readChunk()
		if err != nil {
			c.close()
			return t, err
		}
		if data == nil {
			break
		}
		n := bytes.Count(data, []byte("data: "))
		if n > 0 && t.Events == 0 {
			t.First = time.Since(start)
		}
		t.Events += n
	}
	t.Total = time.Since(start)
	return t, nil
}

func (c *streamClient) readHead() (status int, chunked bool, err error) {
	line, err := c.br.ReadString('\n')
	if err != nil {
		return 0, false, err
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	if status, err = strconv.Atoi(f[1]); err != nil {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	for {
		h, err := c.br.ReadString('\n')
		if err != nil {
			return 0, false, err
		}
		h = strings.TrimRight(h, "\r\n")
		if h == "" {
			return status, chunked, nil
		}
		k, v, _ := strings.Cut(h, ":")
		if strings.EqualFold(k, "Transfer-Encoding") && strings.Contains(strings.ToLower(v), "chunked") {
			chunked = true
		}
	}
}

// readChunk reads one chunk; nil data marks the last one (trailers
// skipped).
func (c *streamClient) readChunk() ([]byte, error) {
	line, err := c.br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	size, err := strconv.ParseUint(strings.TrimSpace(strings.SplitN(line, ";", 2)[0]), 16, 32)
	if err != nil || size > 16<<20 {
		return nil, fmt.Errorf("bad chunk size %q", line)
	}
	if size == 0 {
		for {
			l, err := c.br.ReadString('\n')
			if err != nil {
				return nil, err
			}
			if l == "\r\n" {
				return nil, nil
			}
		}
	}
	data := make([]byte, size+2)
	if _, err := io.ReadFull(c.br, data); err != nil {
		return nil, err
	}
	return data[:size], nil
}
