package main

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// The harness's parsers read wrk's output, /proc/<pid>/stat and
// /proc/<pid>/status, Prometheus text, its own flags, and (in the stub)
// HTTP request heads and (in the streaming clients) chunked answers and SSE
// events: none may panic on any input.

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
	f.Add([]byte("POST / HTTP/1.1\r\nX-Bench-Gap: 300ms\r\nX-Bench-Chunks: 61\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nX-Bench-Gap: -1s\r\nX-Bench-Chunks: 99999999999\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHead(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			return
		}
		if h.clen < 0 || h.clen > 64<<20 {
			t.Fatalf("content length %d accepted", h.clen)
		}
		if h.gap < 0 || h.gap > maxBenchGap || h.chunks < 0 || h.chunks > maxBenchChunks || (h.gap != 0 && !h.gapSet) {
			t.Fatalf("gap %v (set %v), chunks %d accepted", h.gap, h.gapSet, h.chunks)
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

// FuzzParseEventTime: a send time is read only from the digits after the
// first "t":, and is positive.
func FuzzParseEventTime(f *testing.F) {
	f.Add(timedEvent(nil, 3, 1700000000123456789))
	f.Add([]byte(`"t":9223372036854775807`))
	f.Add([]byte(`"t":9223372036854775808`))
	f.Add([]byte(`{"t":-1,"t":5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok := parseEventTime(b)
		if !ok {
			return
		}
		digits := bytes.TrimLeft(b[bytes.Index(b, []byte(`"t":`))+4:], "0")
		if v <= 0 || !bytes.HasPrefix(digits, []byte(strconv.FormatInt(v, 10))) {
			t.Fatalf("%q read as %d", b, v)
		}
	})
}

func FuzzParseGauge(f *testing.F) {
	f.Add([]byte("# TYPE go_goroutines gauge\ngo_goroutines 25\n"), "go_goroutines")
	f.Add([]byte("go_memstats_heap_inuse_bytes 3.293184e+06 1700000000\n"), "go_memstats_heap_inuse_bytes")
	f.Add([]byte("g NaN\ng{x=\"1\"} 2\n"), "g")
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		if v, err := parseGauge(b, name); err == nil && (v < 0 || v > maxMemBytes) {
			t.Fatalf("%q read as %d", b, v)
		}
	})
}

// FuzzParseStreamCounts: the counts accepted are each within bounds, at
// most maxOpenCounts, none twice.
func FuzzParseStreamCounts(f *testing.F) {
	for _, s := range []string{"2000", "2000,10000", "0", "", " 5 , 6", "0,1", "-1", "1,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ns, err := parseStreamCounts(s)
		if err != nil {
			return
		}
		if len(ns) > maxOpenCounts {
			t.Fatalf("%q: %d counts", s, len(ns))
		}
		seen := map[int]bool{}
		for _, n := range ns {
			if n < 1 || n > maxOpenStreams || seen[n] {
				t.Fatalf("%q: counts %v", s, ns)
			}
			seen[n] = true
		}
	})
}

// FuzzSSEReader: the open-streams client's reader never panics, never
// holds more than maxPendingEvent bytes, and returns events that hold no
// blank line.
func FuzzSSEReader(f *testing.F) {
	f.Add("6\r\ndata: \r\nb;x=1\r\na\n\ndata: b\n\r\n0\r\n\r\n")
	f.Add(string(appendChunk(nil, timedEvent(nil, 1, 1))) + "0\r\n\r\n")
	f.Add("ffffffff\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 1<<18 {
			return
		}
		br := bufio.NewReader(strings.NewReader(s))
		var r sseReader
		for i := 0; i < 1000; i++ {
			data, err := r.next(br)
			if err != nil || data == nil {
				return
			}
			if len(r.buf) > maxPendingEvent {
				t.Fatalf("holds %d bytes", len(r.buf))
			}
			for {
				ev, ok := r.event()
				if !ok {
					break
				}
				if bytes.Contains(ev, []byte("\n\n")) {
					t.Fatalf("event %q holds a blank line", ev)
				}
			}
		}
	})
}
