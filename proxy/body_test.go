package proxy

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

func TestBodyBudget(t *testing.T) {
	bb := newBodyBudget(8 << 20) // large bodies: 4 MiB of it
	past := time.Now()
	if !bb.take(3<<20, true, past) || !bb.take(1<<20, true, past) {
		t.Fatal("4 MiB of large bodies refused in an empty budget")
	}
	if bb.take(1, true, past) {
		t.Error("a large body took more than half of the budget")
	}
	if !bb.take(4<<20, false, past) {
		t.Error("small bodies cannot use the half large ones left")
	}
	if bb.take(1, false, past) {
		t.Error("the budget was overdrawn")
	}
	if used, large := bb.held(); used != 8<<20 || large != 4<<20 {
		t.Errorf("held %d (%d large), want %d (%d)", used, large, 8<<20, 4<<20)
	}

	// A taker waits for room, and gets it when bytes come back.
	got := make(chan bool)
	go func() { got <- bb.take(2<<20, true, time.Now().Add(10*time.Second)) }()
	select {
	case <-got:
		t.Fatal("took bytes the budget did not have")
	case <-time.After(50 * time.Millisecond):
	}
	bb.give(3<<20, true)
	if !<-got {
		t.Fatal("a waiting taker got no room once bytes came back")
	}
	// Without room, a taker gives up at its deadline.
	start := time.Now()
	if bb.take(4<<20, true, start.Add(100*time.Millisecond)) {
		t.Fatal("took bytes the budget did not have")
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("gave up after %s, before its deadline", d)
	}
	bb.give(2<<20, true)
	bb.give(1<<20, true)
	bb.give(4<<20, false)
	if used, large := bb.held(); used != 0 || large != 0 {
		t.Errorf("held %d (%d large) after everything came back", used, large)
	}
}

func TestBodyBufferClasses(t *testing.T) {
	bb := newBodyBudget(64 << 20)
	for _, n := range []int{1, minBodyBuf, minBodyBuf + 1, 100 << 10, largeBody} {
		b, h := bb.buf(n)
		if len(b) != n || h == nil || cap(b) < n || cap(b)&(cap(b)-1) != 0 || bodyClass(cap(b)) != bodyClass(n) {
			t.Errorf("buf(%d): len %d cap %d, pooled %v", n, len(b), cap(b), h != nil)
		}
		bb.put(h)
	}
	if b, h := bb.buf(largeBody + 1); len(b) != largeBody+1 || h != nil {
		t.Errorf("a large buffer: len %d, pooled %v", len(b), h != nil)
	}
}

// bodyStub answers each request with its body's length and SHA-256, after
// waiting for hold (nil: at once).
func bodyStub(t *testing.T, hold <-chan struct{}) *stub {
	return newStub(t, "bodies", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if hold != nil {
			<-hold
		}
		fmt.Fprintf(w, "%d %x", len(b), sha256.Sum256(b))
	})
}

// Bodies larger than what the budget has room for wait, then get 503
// body_memory_full; ordinary requests are served meanwhile; every body that
// is taken reaches the backend whole, chunked or not; the budget comes back
// to zero.
func TestBodyMemoryFull(t *testing.T) {
	hold := make(chan struct{})
	a := bodyStub(t, hold)
	cfg := testProxyConfig()
	cfg.MaxBodySize = 3 << 20
	cfg.MaxBodyMemory = 6 << 20 // large bodies: 3 MiB
	cfg.BodyMemoryWait = 200 * time.Millisecond
	h := startProxy(t, cfg, ring.DefaultConfig(), a)

	big := chatReq(strings.Repeat("d", 2<<20), "")
	want := fmt.Sprintf("%d %x", len(big), sha256.Sum256([]byte(big)))
	// The first large body is taken, and held by the backend.
	var first sync.WaitGroup
	first.Add(1)
	go func() {
		defer first.Done()
		resp, b := post(t, h.url+"/v1/chat/completions", big)
		if resp.StatusCode != 200 || string(b) != want {
			t.Errorf("the first large body: %d %.80s, want 200 %s", resp.StatusCode, b, want)
		}
	}()
	waitFor(t, func() bool { _, large := h.p.bodies.held(); return large > 0 }, "the first large body taken")

	// A second finds no room in the large half.
	start := time.Now()
	resp, b := rawExchange(t, h, chatRaw("", big))
	if resp.StatusCode != 503 || decodeError(t, b).Code != "body_memory_full" || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("a large body over the budget: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	if d := time.Since(start); d < cfg.BodyMemoryWait {
		t.Errorf("refused after %s, before waiting %s for room", d, cfg.BodyMemoryWait)
	}
	// An ordinary prompt, and a chunked one, still go through.
	go func() { time.Sleep(100 * time.Millisecond); close(hold) }()
	small := chatReq("a short question", "")
	if resp, b := post(t, h.url+"/v1/chat/completions", small); resp.StatusCode != 200 || string(b) != fmt.Sprintf("%d %x", len(small), sha256.Sum256([]byte(small))) {
		t.Errorf("a small body beside a held large one: %d %s", resp.StatusCode, b)
	}
	first.Wait()

	chunked := chatReq(strings.Repeat("c", 100<<10), "")
	resp, b = rawExchange(t, h, chunkedRaw(chunked, 7<<10))
	if resp.StatusCode != 200 || string(b) != fmt.Sprintf("%d %x", len(chunked), sha256.Sum256([]byte(chunked))) {
		t.Errorf("a chunked body: %d %.80s", resp.StatusCode, b)
	}
	// A chunked body over MaxBodySize: 413.
	resp, b = rawExchange(t, h, chunkedRaw(chatReq(strings.Repeat("x", 4<<20), ""), 64<<10))
	if resp.StatusCode != 413 || decodeError(t, b).Code != "body_too_large" {
		t.Errorf("a chunked body over the limit: %d %s", resp.StatusCode, b)
	}
	// Now the large body has room again.
	if resp, b := post(t, h.url+"/v1/chat/completions", big); resp.StatusCode != 200 || string(b) != want {
		t.Errorf("a large body once the budget has room: %d %.80s", resp.StatusCode, b)
	}
	waitFor(t, func() bool { used, _ := h.p.bodies.held(); return used == 0 }, "every body given back")
}

// chunkedRaw is a chat request whose body goes in chunks of size bytes.
func chunkedRaw(body string, size int) string {
	var b strings.Builder
	b.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
	for len(body) > 0 {
		n := min(size, len(body))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", n, body[:n])
		body = body[n:]
	}
	b.WriteString("0\r\n\r\n")
	return b.String()
}
