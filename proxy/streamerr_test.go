package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// TestStreamCutByUpstream: when the engine breaks a stream off between two
// events (it fails, or stays silent past StreamIdleTimeout), the client
// gets the events so far, an OpenAI-style error event and a clean end of
// the body, without "data: [DONE]"; when it breaks off inside an event,
// the client's connection is cut instead, so no event is corrupted.
func TestStreamCutByUpstream(t *testing.T) {
	cases := []struct {
		name      string
		after     string // what the engine writes after two events
		silent    bool   // then stays silent instead of failing
		wantEvent bool
	}{
		{name: "fails between events", wantEvent: true},
		{name: "silent past the idle timeout", silent: true, wantEvent: true},
		{name: "fails inside an event", after: `data: {"n":3,"text":"hal`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fl := w.(http.Flusher)
				for i := 1; i <= 2; i++ {
					fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
					fl.Flush()
				}
				io.WriteString(w, tc.after)
				fl.Flush()
				if tc.silent {
					select {
					case <-release:
					case <-r.Context().Done():
					}
					return
				}
				time.Sleep(20 * time.Millisecond)
				panic(http.ErrAbortHandler) // drop the connection mid-body
			})
			cfg := testProxyConfig()
			cfg.StreamIdleTimeout = 300 * time.Millisecond
			h := startProxy(t, cfg, ring.DefaultConfig(), a)
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(chatReq("cut me", `,"stream":true`)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(body), "data: {\"n\":1}\n\ndata: {\"n\":2}\n\n") {
				t.Fatalf("events before the cut lost: %q", body)
			}
			if strings.Contains(string(body), "[DONE]") {
				t.Fatalf("a cut stream claims to be complete: %q", body)
			}
			if tc.wantEvent {
				if rerr != nil {
					t.Fatalf("body did not end cleanly after the error event: %v (%q)", rerr, body)
				}
				if !strings.HasSuffix(string(body), "\n\ndata: "+`{"error":{"message":"the inference backend stopped sending this stream before it ended","type":"server_error","param":null,"code":"upstream_stream_failed"}}`+"\n\n") {
					t.Fatalf("no error event at the end: %q", body)
				}
			} else {
				if rerr == nil {
					t.Fatalf("a stream cut inside an event ended cleanly: %q", body)
				}
				if strings.Contains(string(body), "upstream_stream_failed") {
					t.Fatalf("error event appended inside an event: %q", body)
				}
			}
			waitFor(t, func() bool { return h.p.Status()[0].InFlight == 0 }, "in-flight back to 0")
		})
	}
}

// TestStreamBadFramingBetweenEvents: an engine whose chunked framing breaks
// after two whole events (an endless chunk extension, an endless trailer
// after the last chunk, a chunk size that is not hex) gets the same answer
// as one that fails there: the client has the events, an error event and a
// clean end of the body; on the relay and on the goroutine path.
func TestStreamBadFramingBetweenEvents(t *testing.T) {
	events := "data: {\"n\":1}\n\ndata: {\"n\":2}\n\n"
	cases := []struct{ name, after string }{
		{"endless chunk extension", "5;ext=" + strings.Repeat("x", 64<<10)},
		{"endless trailer", "0\r\nX-Trailer: " + strings.Repeat("y", 64<<10)},
		{"too many trailers", "0\r\n" + strings.Repeat("X-T: 1234567890\r\n", 4<<10)},
		{"chunk size not hex", "zz\r\n"},
	}
	for _, relayOn := range []bool{true, false} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/relay=%v", tc.name, relayOn), func(t *testing.T) {
				ln := serveConns(t, func(c net.Conn) {
					br := bufio.NewReader(c)
					for {
						req, err := http.ReadRequest(br)
						if err != nil {
							return
						}
						io.Copy(io.Discard, req.Body)
						if req.URL.Path == "/health" {
							io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
							continue
						}
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%s", len(events), events, tc.after)
						time.Sleep(200 * time.Millisecond)
						return
					}
				})
				cfg := testProxyConfig()
				cfg.StreamRelay = relayOn
				h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "raw/", Addr: "http://" + ln.Addr().String()}})
				resp, body := exchange(t, h.dial(t), chatRaw("", chatReq("framing", `,"stream":true`)))
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				if !strings.HasPrefix(string(body), events) || !strings.HasSuffix(string(body), `"code":"upstream_stream_failed"}}`+"\n\n") {
					t.Fatalf("want the events, an error event and a clean end; got %q", body)
				}
				waitFor(t, func() bool { return h.p.Status()[0].InFlight == 0 }, "in-flight back to 0")
			})
		}
	}
}
