package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// A complete answer the backend sends chunked reaches the client whole and
// correctly framed.
func TestCompleteAnswerFromChunkedBackend(t *testing.T) {
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fl := w.(http.Flusher)
		io.WriteString(w, `{"object":"chat.completion",`)
		fl.Flush() // no Content-Length: net/http sends chunks
		io.WriteString(w, `"choices":[]}`)
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	for i := 0; i < 3; i++ { // on one keep-alive connection
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq("hello", ""))
		if resp.StatusCode != 200 || string(body) != `{"object":"chat.completion","choices":[]}` {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if resp.ContentLength != int64(len(body)) {
			t.Errorf("content length %d for %d bytes", resp.ContentLength, len(body))
		}
	}
}

// Request bodies of every size reach the backend intact: small ones go out
// with the read of the answer, large ones in several writes.
func TestRequestBodiesOfAllSizes(t *testing.T) {
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"len":%d,"tail":%q}`, len(b), b[max(0, len(b)-20):])
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	for _, n := range []int{100, 4 << 10, 20 << 10, 70 << 10, 1 << 20} {
		body := chatReq(strings.Repeat("x", n)+"END", "")
		resp, got := post(t, h.url+"/v1/chat/completions", body)
		want := fmt.Sprintf(`{"len":%d,"tail":%q}`, len(body), body[len(body)-20:])
		if resp.StatusCode != 200 || string(got) != want {
			t.Fatalf("%d-byte prompt: got %d %s, want %s", n, resp.StatusCode, got, want)
		}
	}
}

// A pooled upstream connection the backend closed while it sat idle (a
// keep-alive timeout, a restart) is noticed before the request is written
// to it: the request goes out on a new connection instead of failing.
func TestPooledConnectionClosedByBackend(t *testing.T) {
	ln := listen(t)
	var accepted atomic.Int64
	closed := make(chan struct{}, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				body := `{"object":"chat.completion"}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s", strconv.Itoa(len(body)), body)
				c.Close() // no Connection: close: the proxy pooled it
				closed <- struct{}{}
			}()
		}
	}()
	cfg := testProxyConfig()
	cfg.ProbePath = ""
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "a/", Addr: "http://" + ln.Addr().String()}})
	for i := 0; i < 3; i++ {
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq("hello", ""))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		<-closed
	}
	if n := accepted.Load(); n != 3 {
		t.Errorf("backend accepted %d connections, want 3", n)
	}
}

// An engine that sends its headers first and its first event later (as
// vLLM does during prefill): the client gets the headers at once.
func TestStreamHeadersBeforeFirstEvent(t *testing.T) {
	release := make(chan struct{})
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		released(release)
		io.WriteString(w, "data: {\"n\":1}\n\ndata: [DONE]\n\n")
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	for i := 0; i < 2; i++ { // a fresh and a pooled upstream connection
		got := make(chan *http.Response, 1)
		go func() {
			resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(chatReq("p", `,"stream":true`)))
			if err != nil {
				t.Error(err)
				close(got)
				return
			}
			got <- resp
		}()
		var resp *http.Response
		select {
		case resp = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("headers held until the first event")
		}
		if resp == nil {
			t.FailNow()
		}
		release <- struct{}{}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get("Content-Type") != "text/event-stream" || string(body) != "data: {\"n\":1}\n\ndata: [DONE]\n\n" {
			t.Fatalf("got %v %q", resp.Header, body)
		}
	}
}

// An engine that sends its headers and first event together: both arrive,
// then the rest as it comes; an empty stream ends cleanly.
func TestStreamHeadersWithFirstEvent(t *testing.T) {
	release := make(chan struct{})
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(string(body), "empty") {
			w.Header().Set("Content-Length", "0")
			return
		}
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		released(release)
		io.WriteString(w, "data: [DONE]\n\n")
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	for i := 0; i < 3; i++ {
		resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(chatReq("p", `,"stream":true`)))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "data: {\"n\":1}\n" {
			t.Fatalf("first line %q, %v", line, err)
		}
		release <- struct{}{}
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		if string(rest) != "\ndata: [DONE]\n\n" {
			t.Fatalf("rest %q", rest)
		}
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq("empty", `,"stream":true`))
		if resp.StatusCode != 200 || len(body) != 0 {
			t.Fatalf("empty stream: %d %q", resp.StatusCode, body)
		}
	}
	waitFor(t, func() bool { return h.p.Status()[0].InFlight == 0 }, "in-flight back to 0")
}

// A pooled connection whose last read deadline has passed (a health
// probe's short one) and which the backend then closed (a crash, a
// restart) is noticed before the request is written to it, like any other
// closed pooled connection: the request is retried on a new one.
func TestPooledConnectionClosedAfterProbeDeadline(t *testing.T) {
	var probes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			probes.Add(1)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"object":"chat.completion"}`)
	}))
	defer srv.Close()
	cfg := testProxyConfig()
	cfg.ProbeInterval = time.Hour // one probe, at start
	cfg.ProbeTimeout = 100 * time.Millisecond
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "a/", Addr: srv.URL}})
	waitFor(t, func() bool { return probes.Load() == 1 }, "the first probe")
	time.Sleep(300 * time.Millisecond) // the probe's read deadline passes
	srv.CloseClientConnections()       // the backend drops its connections
	time.Sleep(50 * time.Millisecond)
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("hello", ""))
	if resp.StatusCode != 200 {
		t.Fatalf("request after the backend closed the probe's pooled connection: %d %s", resp.StatusCode, body)
	}
}

// An upstream connection notices that the backend closed it while it sat
// idle after a request with its own short deadline (a health probe's),
// both through its raw socket (Linux) and through the portable check the
// other unix systems use (run here on whatever this is): the next request
// is not written to it, and fasthttp may send it on a new one.
func TestStaleUpstreamAfterLapsedDeadline(t *testing.T) {
	for _, path := range []string{"raw", "portable"} {
		t.Run(path, func(t *testing.T) {
			ln := listen(t)
			cfg := testProxyConfig()
			c, err := newDialer(&cfg)(ln.Addr().String(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			srv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			uc := c.(*upstreamConn)
			switch {
			case path == "portable":
				uc.d = nil
			case uc.d == nil:
				t.Skip("no raw socket I/O on this platform")
			}

			// The probe: a request, then its own deadline for the answer
			// (as fasthttp sets it), and the answer.
			req := "GET /health HTTP/1.1\r\nHost: b\r\n\r\n"
			if _, err := io.WriteString(uc, req); err != nil {
				t.Fatal(err)
			}
			probeEnd := time.Now().Add(100 * time.Millisecond)
			if err := uc.SetReadDeadline(probeEnd); err != nil {
				t.Fatal(err)
			}
			go func() {
				buf := make([]byte, len(req))
				if _, err := io.ReadFull(srv, buf); err == nil {
					io.WriteString(srv, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
				}
			}()
			if _, err := uc.Read(make([]byte, 64)); err != nil {
				t.Fatal(err)
			}

			time.Sleep(time.Until(probeEnd) + 20*time.Millisecond) // the probe's deadline lapses
			if uc.peerClosed() {
				t.Fatal("an open idle connection reported closed")
			}
			srv.Close() // the backend goes away
			waitFor(t, uc.peerClosed, "the check to see the closed connection")
			if _, err := io.WriteString(uc, req); !errors.Is(err, errStaleConn) {
				t.Fatalf("write to the closed pooled connection: %v, want errStaleConn", err)
			}
		})
	}
}
