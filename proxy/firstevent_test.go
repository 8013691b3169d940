package proxy

import (
	"bytes"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// newFirstEventStub is a raw backend that answers a streamed request with
// the SSE head and a first event, then, after gap, the rest of a short
// stream. gap 0: the head and the first event in one write (an engine
// that sends its headers with the first event).
func newFirstEventStub(t testing.TB, gap time.Duration) string {
	first := chunked("data: {\"t\":1}\n\n")
	first = first[:len(first)-5]
	rest := chunked("data: {\"t\":2}\n\n", "data: [DONE]\n\n")
	ln := serveConns(t, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		var in []byte
		for {
			// One request: its head and a Content-Length body.
			for {
				i := bytes.Index(in, crlfcrlf)
				if i >= 0 {
					lower := strings.ToLower(string(in[:i]))
					j := strings.Index(lower, "content-length:")
					n := 0
					for _, ch := range strings.TrimSpace(lower[j+len("content-length:"):]) {
						if ch < '0' || ch > '9' {
							break
						}
						n = n*10 + int(ch-'0')
					}
					if len(in) >= i+4+n {
						in = in[:copy(in, in[i+4+n:])]
						break
					}
				}
				k, err := c.Read(buf)
				if err != nil {
					return
				}
				in = append(in, buf[:k]...)
			}
			var err error
			if gap == 0 {
				_, err = c.Write(append(append([]byte(nil), rawSSEHead...), first...))
			} else {
				c.Write(rawSSEHead)
				time.Sleep(gap)
				_, err = c.Write(first)
			}
			if err != nil {
				return
			}
			if _, err := c.Write(rest); err != nil {
				return
			}
		}
	})
	return "http://" + ln.Addr().String()
}

// firstEvent sends req on c and returns how long the first event took to
// arrive; it reads the whole answer (ending with the last chunk).
func firstEvent(c net.Conn, req, buf []byte) (time.Duration, error) {
	start := time.Now()
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	var got []byte
	var first time.Duration
	for {
		n, err := c.Read(buf)
		if err != nil {
			return 0, err
		}
		got = append(got, buf[:n]...)
		if first == 0 && bytes.Contains(got, []byte("data: ")) {
			first = time.Since(start)
		}
		if bytes.HasSuffix(got, []byte("0\r\n\r\n")) && bytes.Contains(got, []byte("[DONE]")) {
			return first, nil
		}
	}
}

// BenchmarkFirstEvent measures the time from a streamed request written to
// its first event read, directly from a stub backend and through the proxy
// on the goroutine path and on the relay, over a keep-alive client
// connection: p50 and p90 in microseconds (first-p50-us, first-p90-us).
// The stub sends its headers with the first event, or 1 ms before it.
// Client, proxy and stub share the CPU, so the figures are round trips
// through all three, to be compared with each other in one run.
func BenchmarkFirstEvent(b *testing.B) {
	for _, gap := range []time.Duration{0, time.Millisecond} {
		name := "headers-with-event"
		if gap > 0 {
			name = "headers-first"
		}
		for _, target := range []string{"direct", "goroutine", "relay"} {
			b.Run(name+"/"+target, func(b *testing.B) {
				stub := newFirstEventStub(b, gap)
				addr := strings.TrimPrefix(stub, "http://")
				if target != "direct" {
					cfg := DefaultConfig()
					cfg.ProbePath = ""
					cfg.StreamRelay = target == "relay"
					h := startProxyBackends(b, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "s/", Addr: stub}})
					addr = strings.TrimPrefix(h.url, "http://")
				}
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				req, buf := chatRequest(1<<10, true), make([]byte, 64<<10)
				for range 50 {
					if _, err := firstEvent(c, req, buf); err != nil {
						b.Fatal(err)
					}
				}
				ds := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for range b.N {
					d, err := firstEvent(c, req, buf)
					if err != nil {
						b.Fatal(err)
					}
					ds = append(ds, d)
				}
				b.StopTimer()
				slices.Sort(ds)
				b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "first-p50-us")
				b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds()), "first-p90-us")
			})
		}
	}
}
