package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

// A JSON body that is not valid UTF-8 is refused before any backend sees
// it; the opaque /invocations body is not checked.
func TestInvalidUTF8Refused(t *testing.T) {
	a := newStub(t, "a", nil)
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	bad := "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}"
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := bad
		if path == "/v1/completions" {
			body = "{\"model\":\"m\",\"prompt\":\"ok\",\"user\":\"\xff\"}"
		}
		resp, got := post(t, h.url+path, body)
		if e := decodeError(t, got); resp.StatusCode != 400 || e.Code != "invalid_json" || !strings.Contains(e.Message, "invalid UTF-8 at byte") {
			t.Errorf("%s: %d %s", path, resp.StatusCode, got)
		}
	}
	if n := a.hits.Load(); n != 0 {
		t.Fatalf("invalid UTF-8 reached the backend %d times", n)
	}
	resp, got := post(t, h.url+"/v1/chat/completions", chatReq("café 日本語 \U0001F600", ""))
	if resp.StatusCode != 200 {
		t.Fatalf("valid UTF-8: %d %s", resp.StatusCode, got)
	}
	resp, got = post(t, h.url+"/invocations", "\xff\xfe raw bytes")
	if resp.StatusCode != 200 {
		t.Fatalf("raw /invocations: %d %s", resp.StatusCode, got)
	}
	if _, _, err := h.p.Explain(ring.Chat, []byte(bad), nil); !errors.Is(err, ring.ErrMalformedJSON) {
		t.Fatalf("Explain: %v, want ErrMalformedJSON", err)
	}
}

func TestFirstInvalidUTF8(t *testing.T) {
	for in, want := range map[string]int{"": -1, "abc": -1, "é日\U0001F600": -1, "ab\xff": 2,
		"\xed\xa0\x80": 0, "é\xc0\xaf": 2, "\xef\xbf\xbd": -1, "日\xe6\x97": 3} {
		if got := firstInvalidUTF8([]byte(in)); got != want {
			t.Errorf("firstInvalidUTF8(%q) = %d, want %d", in, got, want)
		}
	}
}

// endless streams events as fast as the connection takes them until the
// client goes; it reports when its request context ended.
func endless(t *testing.T, gone chan<- struct{}) *stub {
	var once sync.Once
	return newStub(t, "endless", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		ev := []byte("data: " + strings.Repeat("x", 1000) + "\n\n")
		for {
			if _, err := w.Write(ev); err != nil {
				break
			}
			fl.Flush()
			if r.Context().Err() != nil {
				break
			}
		}
		once.Do(func() { close(gone) })
	})
}

// A client that stops reading a stream is cut after WriteTimeout without
// progress, and the engine stops generating.
func TestWriteTimeoutCutsClientThatStopsReading(t *testing.T) {
	gone := make(chan struct{})
	a := endless(t, gone)
	cfg := testProxyConfig()
	cfg.WriteTimeout = 300 * time.Millisecond
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	c := h.dial(t)
	io.WriteString(c, chatRaw("", chatReq("stream", `,"stream":true`)))
	// Never read.
	waitChan(t, gone, 20*time.Second, "the engine still streams to a client that stopped reading")
	waitAbortCounted(t, h, a)
}

// WriteTimeout bounds stalls, not streams: a stream lasting several times
// WriteTimeout that the client reads arrives whole.
func TestWriteTimeoutSparesLongStreams(t *testing.T) {
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 10; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(60 * time.Millisecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	cfg := testProxyConfig()
	cfg.WriteTimeout = 100 * time.Millisecond
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	resp, got := post(t, h.url+"/v1/chat/completions", chatReq("long", `,"stream":true`))
	if resp.StatusCode != 200 || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) || bytes.Count(got, []byte("data: ")) != 11 {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
}

// Connections over MaxConns get an OpenAI-style 503 and are closed; the
// others are served, and a slot freed is taken again.
func TestMaxConnsRefusedWithJSON(t *testing.T) {
	a := newStub(t, "a", nil)
	cfg := testProxyConfig()
	cfg.MaxConns = 2
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	req := chatRaw("", chatReq("x", ""))
	held := []net.Conn{h.dial(t), h.dial(t)}
	for _, c := range held {
		if resp, b := exchange(t, c, req); resp.StatusCode != 200 {
			t.Fatalf("within the limit: %d %s", resp.StatusCode, b)
		}
	}
	resp, b := exchange(t, h.dial(t), req)
	if resp.StatusCode != 503 || decodeError(t, b).Code != "too_many_connections" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the limit: %d %s", resp.StatusCode, b)
	}
	if got := testutil.ToFloat64(h.p.m.connsRejected); got != 1 {
		t.Errorf("rejections counted %v, want 1", got)
	}
	held[0].Close()
	waitFor(t, func() bool { return h.p.open.Load() == 1 }, "a closed connection frees its slot")
	if resp, b := exchange(t, h.dial(t), req); resp.StatusCode != 200 {
		t.Fatalf("after a slot freed: %d %s", resp.StatusCode, b)
	}
}

// When every backend is at MaxConnsPerBackend for MaxConnWait, the answer
// is 503 backends_saturated (retry later), not 502.
func TestBackendsSaturated(t *testing.T) {
	release := make(chan struct{})
	var cur atomic.Int64
	a := holdStub(t, "a", release, &cur)
	defer close(release)
	cfg := testProxyConfig()
	cfg.MaxConnsPerBackend = 1
	cfg.MaxConnWait = 100 * time.Millisecond
	cfg.ProbePath = ""
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	heldDone := make(chan struct{})
	go func() {
		defer close(heldDone)
		if resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(chatReq("held", ""))); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	t.Cleanup(func() { <-heldDone })
	waitFor(t, func() bool { return cur.Load() == 1 }, "first request held")
	resp, b := post(t, h.url+"/v1/chat/completions", chatReq("second", ""))
	if resp.StatusCode != 503 || decodeError(t, b).Code != "backends_saturated" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("saturated: %d %s", resp.StatusCode, b)
	}
}

// A malformed request is never echoed into the logs, even at debug level.
func TestMalformedRequestNotLogged(t *testing.T) {
	a := newStub(t, "a", nil)
	var logs testkit.Buffer
	cfg := testProxyConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	const secret = "sk-SECRET-7f3a9"
	reqs := []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nContent-Length: zz\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-" + secret + " broken header\r\n\r\n",
		"GET /" + secret + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nX-Big: " + strings.Repeat("b", 20<<10) + "\r\n\r\n",
		secret + "\r\n\r\n",
	}
	for _, r := range reqs {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, r)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%.40q: %v", r, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode < 400 || bytes.Contains(b, []byte(secret)) {
			t.Errorf("%.40q: %d %s", r, resp.StatusCode, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.p.Shutdown(ctx)
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("request bytes in the logs:\n%s", logs.String())
	}
}

func TestRedactQuoted(t *testing.T) {
	for in, want := range map[string]string{
		`plain`: `plain`,
		`error when serving connection "127.0.0.1:80"<->"[::1]:5555": missing colon: "Authorization: Bearer x"`: `error when serving connection "127.0.0.1:80"<->"[::1]:5555": missing colon: "…"`,
		`a "q\"uoted \\" b "c"`: `a "…" b "…"`,
		`unterminated "secret`:  `unterminated "…`,
		`trailing backslash "\`: `trailing backslash "…`,
	} {
		if got := redactQuoted(in); got != want {
			t.Errorf("redactQuoted(%q) = %q, want %q", in, got, want)
		}
	}
}

// BenchmarkRouteDecision is ring's BenchmarkRoute (key extraction and
// pick for a chat body with a 4 KiB prompt) as the proxy runs it, with and
// without the UTF-8 check.
func BenchmarkRouteDecision(b *testing.B) {
	var bs []ring.Backend
	for i := 0; i < 7; i++ {
		bs = append(bs, ring.Backend{ID: fmt.Sprintf("gpu-%d/", i), Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)})
	}
	r, err := ring.New(ring.DefaultConfig(), bs)
	if err != nil {
		b.Fatal(err)
	}
	st := &reqState{}
	st.reset(&table{ring: r, bs: make([]*backend, len(bs))}, time.Now())
	for i := range st.t.bs {
		st.t.bs[i] = &backend{}
	}
	kc := r.Config().Key()
	for _, size := range []int{4 << 10, 64 << 10} {
		prompt := strings.Repeat("Shared system prompt text that many requests repeat. ", size/52+1)[:size]
		body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, prompt))
		for _, check := range []bool{false, true} {
			b.Run(fmt.Sprintf("prompt=%dKiB/utf8=%v", size>>10, check), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if err := ring.Extract(kc, ring.Chat, body, nil, &st.info); err != nil {
						b.Fatal(err)
					}
					if check {
						if err := checkUTF8(kc, ring.Chat, body); err != nil {
							b.Fatal(err)
						}
					}
					if _, err := r.Pick(st.info.Key, st); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// A body over the limit is answered 413 without being read, and the
// client must get that answer, not a reset while it is still sending.
// Closing on the unread bytes would reset the connection; clients that
// write the whole body before reading (Go's net/http among them, at times)
// then report the failed write instead of the 413.
func TestBodyTooLargeAnswerSurvivesUnreadBody(t *testing.T) {
	a := newStub(t, "a", nil)
	cfg := testProxyConfig()
	cfg.MaxBodySize = 64 << 10
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	// Far more than loopback's socket buffers hold: the write goes on
	// after the router answered. A failed write or read fails the test.
	resp, b := rawExchange(t, h, chatRaw("", chatReq(strings.Repeat("x", 8<<20), "")))
	if resp.StatusCode != 413 || decodeError(t, b).Code != "body_too_large" {
		t.Fatalf("got %d %s", resp.StatusCode, b)
	}
}

// An HTTP/1.0 client that stops reading a stream, which goes to it
// unframed (passIdentity, or the relay's identity mode), is cut after
// WriteTimeout like any other, on the relay and off it, and the engine
// stops generating.
func TestWriteTimeoutCutsHTTP10ClientThatStopsReading(t *testing.T) {
	for _, relayOn := range []bool{true, false} {
		gone := make(chan struct{})
		a := endless(t, gone)
		cfg := testProxyConfig()
		cfg.WriteTimeout = 300 * time.Millisecond
		cfg.StreamRelay = relayOn
		h := startProxy(t, cfg, ring.DefaultConfig(), a)
		c := h.dial(t)
		req := strings.Replace(chatRaw("Connection: keep-alive\r\n", chatReq("stream", `,"stream":true`)), " HTTP/1.1\r\n", " HTTP/1.0\r\n", 1)
		io.WriteString(c, req)
		// Never read.
		waitChan(t, gone, 20*time.Second, fmt.Sprintf("relay %v: the engine still streams to an HTTP/1.0 client that stopped reading", relayOn))
		waitAbortCounted(t, h, a)
	}
}
