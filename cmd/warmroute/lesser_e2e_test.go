package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// TestE2ETraceparentReplaced: with tracing on, a request reaches the
// backend with one traceparent, the router's, even when the client sent
// two (on 114309c the client's second one reached the backend beside the
// router's). Without tracing the client's fields pass as they came.
func TestE2ETraceparentReplaced(t *testing.T) {
	t.Parallel()
	needBinary(t)
	var mu sync.Mutex
	var seen [][]string
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		mu.Lock()
		seen = append(seen, r.Header.Values("Traceparent"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","choices":[{"message":{"content":"ok"}}]}`)
	}))
	t.Cleanup(be.Close)
	otlp := newOTLPReceiver(t)
	r := startRouter(t, proc.ServeArgs{Backends: []string{be.URL}, NoEngineMetrics: true, Extra: []string{
		"--tracing-endpoint", otlp.srv.URL, "--tracing-sample-ratio", "1"}})

	const mine, second = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "00-11111111111111111111111111111111-2222222222222222-01"
	body := chatJSON("m", "trace me")
	req := httpReq("POST", "/v1/chat/completions", []string{"Traceparent: " + mine, "Traceparent: " + second, "Tracestate: vendor=1"}, body)
	if ex := rawDo(t, strings.TrimPrefix(r.url, "http://"), req, 1, "POST"); ex.err != nil || ex.status() != 200 {
		t.Fatalf("status %d, %v", ex.status(), ex.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("the backend saw %d requests", len(seen))
	}
	got := seen[0]
	if len(got) != 1 || strings.Contains(got[0], "2222222222222222") || !strings.Contains(got[0], "0af7651916cd43dd8448eb211c80319c") || got[0] == mine {
		t.Errorf("the backend saw traceparent %q, want one field: the router's span in the client's trace", got)
	}
}

// TestE2EAccessLogOfRefusedRequest: a request the router could not parse
// is logged with the time it came and a duration of its handling (on
// 114309c: time 0001-01-01 and a duration of 292 years).
func TestE2EAccessLogOfRefusedRequest(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := vllmStub(t)
	accessPath := filepath.Join(t.TempDir(), "access.log")
	r := startRouter(t, proc.ServeArgs{Backends: []string{be.URL}, NoEngineMetrics: true, Extra: []string{
		"--access-log", "on", "--access-log-output", accessPath}})
	before := time.Now()
	// A bare-LF head: the parser refuses it at once (400).
	if ex := rawDo(t, strings.TrimPrefix(r.url, "http://"), []byte("POST /v1/chat/completions HTTP/1.1\nHost: x\n\n"), 1, "POST"); ex.status() != 400 {
		t.Fatalf("status %d, %v", ex.status(), ex.err)
	}
	if err := r.Stop(10 * time.Second); err != nil {
		t.Fatalf("router stopped with %v\n%s", err, r.Logs())
	}
	raw, err := os.ReadFile(accessPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d access log lines, want 1:\n%s", len(lines), raw)
	}
	var m struct {
		Time     time.Time `json:"time"`
		Status   int       `json:"status"`
		Duration float64   `json:"duration_ms"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatalf("%v: %s", err, lines[0])
	}
	if m.Status != 400 || m.Time.Before(before.Add(-time.Second)) || m.Time.After(time.Now()) || m.Duration < 0 || m.Duration > 10_000 {
		t.Errorf("access log line of a refused request: %s", lines[0])
	}
}

// TestE2EStreamBadFramingErrorEvent: an engine whose chunked framing breaks
// between two events (an endless chunk extension, an endless trailer)
// ends the client's stream with the documented SSE error event and a
// clean end, on the relay as off it (on 114309c the relay cut the client's
// connection).
func TestE2EStreamBadFramingErrorEvent(t *testing.T) {
	t.Parallel()
	needBinary(t)
	events := "data: {\"n\":1}\n\ndata: {\"n\":2}\n\n"
	for _, after := range []string{"5;ext=" + strings.Repeat("x", 64<<10), "0\r\nX-Trailer: " + strings.Repeat("y", 64<<10)} {
		be := badFramingEngine(t, events, after)
		for _, relay := range []string{"true", "false"} {
			r := startRouter(t, proc.ServeArgs{Backends: []string{be}, NoProbes: true, NoEngineMetrics: true, Extra: []string{"--stream-relay=" + relay}})
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("framing", true)))
			if err != nil {
				t.Fatal(err)
			}
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr != nil || !strings.HasPrefix(string(b), events) || !strings.HasSuffix(string(b), `"code":"upstream_stream_failed"}}`+"\n\n") {
				t.Errorf("relay %s, after %.20q: want the events, an error event and a clean end; got %q (%v)", relay, after, b, rerr)
			}
			r.Stop(10 * time.Second)
		}
	}
}

// badFramingEngine answers every request with a chunked SSE body: the
// events in one chunk, then after.
func badFramingEngine(t *testing.T, events, after string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%s", len(events), events, after)
				time.Sleep(200 * time.Millisecond)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}
