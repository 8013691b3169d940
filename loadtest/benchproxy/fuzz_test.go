package main

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// The harness's parsers read wrk's output, /proc/<pid>/stat, and (in the
// stub) HTTP request heads and (in the streaming client) chunked answers:
// none may panic on any input.

func FuzzParseWrk(f *testing.F) {
	f.Add([]byte("BENCH requests=10 duration_us=1000 p50_us=1 p90_us=2 p99_us=3 max_us=4 mean_us=1.5 status_errors=0 socket_errors=0\n"))
	f.Add([]byte("BENCH requests=x"))
	f.Add([]byte("BENCH =\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseWrk(b)
		if err == nil && r.Requests == 0 {
			t.Fatal("accepted a run with no request")
		}
	})
}

func FuzzParseStatCPU(f *testing.F) {
	f.Add([]byte("1 (a b) S 1 1 1 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 1 0 0\n"))
	f.Add([]byte("1 (x"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := parseStatCPU(b); err == nil && d < 0 && !bytes.Contains(b, []byte("-")) {
			t.Fatalf("negative cpu time %v", d)
		}
	})
}

func FuzzReadHead(f *testing.F) {
	f.Add([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"))
	f.Add([]byte("GET /health HTTP/1.1\r\nX-Bench-Headers: with-first-event\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, clen, _, err := readHead(bufio.NewReader(bytes.NewReader(b)))
		if err == nil && (clen < 0 || clen > 64<<20) {
			t.Fatalf("content length %d accepted", clen)
		}
	})
}

func FuzzReadChunk(f *testing.F) {
	f.Add("5\r\nhello\r\n0\r\n\r\n")
	f.Add("zz\r\n")
	f.Add("ffffffff\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 1<<16 {
			return
		}
		c := &streamClient{br: bufio.NewReader(strings.NewReader(s))}
		for i := 0; i < 100; i++ {
			data, err := c.readChunk()
			if err != nil || data == nil {
				return
			}
		}
	})
}

// FuzzListenLines: the stubs' addresses are read from whole lines of
// their output only, each line's text after "LISTEN ".
func FuzzListenLines(f *testing.F) {
	f.Add("LISTEN 127.0.0.1:1\nLISTEN 127.0.0.1:2\n")
	f.Add("noise\nLISTEN 127.0.0.1:3")
	f.Add("")
	f.Fuzz(func(t *testing.T, out string) {
		addrs := listenLines(out)
		if n := strings.Count(out, "\n"); len(addrs) > n {
			t.Fatalf("%d addresses from %d whole lines", len(addrs), n)
		}
		for _, a := range addrs {
			if strings.Contains(a, "\n") || !strings.Contains(out, "LISTEN "+a+"\n") {
				t.Fatalf("address %q is not a whole line of %q", a, out)
			}
		}
	})
}
