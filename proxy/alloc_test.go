package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// allocProxy serves a proxy with health checks off in front of one raw
// stub and returns its address.
func allocProxy(t testing.TB, stubs int) string {
	t.Helper()
	var bs []ring.Backend
	for i := 0; i < stubs; i++ {
		s := newRawStub(t)
		bs = append(bs, ring.Backend{ID: fmt.Sprintf("stub-%d/", i), Addr: s.url()})
	}
	cfg := DefaultConfig()
	cfg.ProbePath = ""
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), bs)
	return strings.TrimPrefix(h.url, "http://")
}

func chatRequest(promptBytes int, stream bool) []byte {
	prompt := strings.Repeat("Shared system prompt text that many requests repeat. ", promptBytes/52+1)[:promptBytes]
	body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":16,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, stream, prompt)
	return []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
}

// TestRequestPathAllocations guards the steady-state request path (key
// extraction, pick, forwarding, the answer): a complete (not streamed)
// answer costs no allocation at all.
func TestRequestPathAllocations(t *testing.T) {
	c := newRawClient(t, allocProxy(t, 3))
	n := allocsPerRequest(t, c, chatRequest(4<<10, false), func(head, body []byte) bool {
		return bytes.HasPrefix(head, []byte("HTTP/1.1 200")) && bytes.Equal(body, rawAnswer[len(rawAnswer)-48:])
	})
	if want := maxRequestAllocs(); n > want {
		t.Errorf("a proxied request allocates %.2f times, want %v", n, want)
	}
}

// TestStreamPathAllocations bounds a streamed (SSE) answer's allocations.
// fasthttp's streamed client body allocates a small wrapper and its
// closures per response (4 objects); the proxy's own part allocates
// nothing.
func TestStreamPathAllocations(t *testing.T) {
	c := newRawClient(t, allocProxy(t, 1))
	n := allocsPerRequest(t, c, chatRequest(4<<10, true), func(head, body []byte) bool {
		return bytes.HasPrefix(head, []byte("HTTP/1.1 200")) && bytes.Count(body, []byte("data: ")) == 3
	})
	want := 4.0
	if raceEnabled {
		want = 10 // about 10.5 with pools refilled
	}
	t.Logf("a streamed request allocates %.2f times", n)
	if n > want {
		t.Errorf("a streamed request allocates %.2f times, want at most %v", n, want)
	}
}

// BenchmarkProxy is the whole exchange over loopback in one process:
// client, proxy and stub backend share the CPU, so ns/op is a round trip,
// not the proxy's cost alone (bench-proxy measures that from outside).
func BenchmarkProxy(b *testing.B) {
	for _, conns := range []int{1, 64} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			addr := allocProxy(b, 4)
			req := chatRequest(4<<10, false)
			clients := make([]*rawClient, conns)
			// RunParallel starts at least GOMAXPROCS goroutines; goroutines
			// sharing a connection take turns on it.
			locks := make([]sync.Mutex, conns)
			for i := range clients {
				clients[i] = newRawClient(b, addr)
				if _, _, err := clients[i].do(req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(req)))
			var next int
			var mu sync.Mutex
			start := time.Now()
			b.SetParallelism((conns + 1) / 2)
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				i := next % len(clients)
				next++
				mu.Unlock()
				c, lock := clients[i], &locks[i]
				for pb.Next() {
					lock.Lock()
					_, _, err := c.do(req)
					lock.Unlock()
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
