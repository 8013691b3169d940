package node

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

// streamEngine answers streamed chat requests with chunks SSE events:
// the first before at once, the rest after hold (when set) is closed,
// then [DONE]. Other requests get a JSON answer at once.
type streamEngine struct {
	srv                  *httptest.Server
	chunks, before       int
	hold                 atomic.Pointer[chan struct{}]
	hits, open           atomic.Int64
	finished, cutByPeer  atomic.Int64
	streamsSeen, jsonAns atomic.Int64
}

func newStreamEngine(t *testing.T, chunks, before int) *streamEngine {
	e := &streamEngine{chunks: chunks, before: before}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *streamEngine) id() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *streamEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		return
	}
	body, _ := io.ReadAll(r.Body)
	e.hits.Add(1)
	if !strings.Contains(string(body), `"stream":true`) {
		e.jsonAns.Add(1)
		io.WriteString(w, `{"object":"chat.completion","choices":[{"message":{"content":"ok"}}]}`)
		return
	}
	e.streamsSeen.Add(1)
	e.open.Add(1)
	defer e.open.Add(-1)
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	hold := e.hold.Load()
	for i := 0; i < e.chunks; i++ {
		if i == e.before && hold != nil {
			select {
			case <-*hold:
			case <-r.Context().Done():
				e.cutByPeer.Add(1)
				return
			}
		}
		if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i); err != nil {
			e.cutByPeer.Add(1)
			return
		}
		fl.Flush()
	}
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
	e.finished.Add(1)
}

func chatStream(prompt string) string {
	return fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, prompt)
}

// TestDrainLetsOpenStreamFinish: three routers; a stream is open on the
// owner of a prompt's prefix when an operator drains the owner through
// another router's admin API. The open stream finishes completely (every
// chunk and [DONE]), while new requests with the same prefix, through any
// router, go to one other backend.
func TestDrainLetsOpenStreamFinish(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	const chunks, before = 10, 3
	var engines []*streamEngine
	var urls []string
	for i := 0; i < 3; i++ {
		e := newStreamEngine(t, chunks, before)
		engines = append(engines, e)
		urls = append(urls, e.srv.URL)
	}
	nodes := startCluster(t, 3, func(i int, c *Config) { *c = testConfig(urls) })
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	byID := map[string]*streamEngine{}
	for _, e := range engines {
		byID[e.id()] = e
	}
	release := make(chan struct{})
	for _, e := range engines {
		e.hold.Store(&release)
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	// A stream through router 0; it stops after `before` chunks.
	// Longer than the prefix hashed (4096 bytes by default): every request
	// below has the same routing key.
	prompt := strings.Repeat("You are a careful assistant; this shared document opens every request. ", 80)
	resp, err := http.Post("http://"+nodes[0].TrafficAddr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(chatStream(prompt+" first question")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	owner := resp.Header.Get("X-Warmroute-Backend")
	if resp.StatusCode != 200 || byID[owner] == nil {
		t.Fatalf("stream: status %d, backend %q", resp.StatusCode, owner)
	}
	events := bufio.NewReader(resp.Body)
	var got []string
	readEvent := func() string {
		for {
			line, err := events.ReadString('\n')
			if err != nil {
				t.Fatalf("stream cut after %d events: %v", len(got), err)
			}
			if s, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
				got = append(got, s)
				return s
			}
		}
	}
	for i := 0; i < before; i++ {
		readEvent()
	}

	// Drain the owner through router 1 while the stream is open.
	r := adminDo(t, "POST", "http://"+nodes[1].AdminAddr().String()+"/v1/backends/"+owner+"/drain", "", "")
	if r.status != 200 {
		t.Fatalf("drain: %d %s", r.status, r.raw)
	}
	epoch := uint64(r.body["epoch"].(float64))
	for _, n := range nodes {
		testkit.WaitFor(t, 5*time.Second, "every router at the drain's epoch", func() bool {
			rr, e := n.proxy.Ring()
			i, _ := rr.Index(owner)
			return e >= epoch && rr.Backend(i).State == ring.Draining
		})
	}
	if o := byID[owner]; o.open.Load() != 1 || o.finished.Load() != 0 {
		t.Fatalf("the stream is not open on the owner when drained (open %d, finished %d)", o.open.Load(), o.finished.Load())
	}

	// New requests with the same prefix, through every router, streamed
	// and not: all go to one other backend.
	hitsBefore := byID[owner].hits.Load()
	var successor string
	for _, n := range nodes {
		url := "http://" + n.TrafficAddr().String()
		for i := 0; i < 10; i++ {
			b, err := send(url, chat(fmt.Sprintf("%s question %d", prompt, i)))
			if err != nil {
				t.Fatalf("new request through %s: %v", n.name, err)
			}
			if successor == "" {
				successor = b
			}
			if b == owner || b != successor {
				t.Fatalf("new request through %s went to %s (owner %s, drained; first new request went to %s)", n.name, b, owner, successor)
			}
		}
		// A new stream as well; it is held too, so release only after.
		sresp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatStream(prompt+" streamed")))
		if err != nil {
			t.Fatal(err)
		}
		if b := sresp.Header.Get("X-Warmroute-Backend"); b == owner || b != successor {
			t.Errorf("new stream through %s went to %s (owner %s, successor %s)", n.name, b, owner, successor)
		}
		sresp.Body.Close()
	}
	if h := byID[owner].hits.Load(); h != hitsBefore {
		t.Errorf("the drained owner received %d new requests", h-hitsBefore)
	}
	if d := ownInFlight(nodes[0], owner); d != 1 {
		t.Errorf("router 0 counts %d in flight on the drained owner, want the open stream", d)
	}

	// Let the open stream finish.
	close(release)
	released = true
	for {
		if readEvent() == "[DONE]" {
			break
		}
	}
	want := before + (chunks - before) + 1
	if len(got) != want {
		t.Fatalf("the stream delivered %d events, want %d chunks and [DONE]: %q", len(got), want, got)
	}
	for i := 0; i < chunks; i++ {
		if !strings.Contains(got[i], fmt.Sprintf(`"t%d"`, i)) {
			t.Fatalf("event %d is %q", i, got[i])
		}
	}
	if rest, _ := io.ReadAll(events); strings.TrimSpace(string(rest)) != "" {
		t.Errorf("data after [DONE]: %q", rest)
	}
	o := byID[owner]
	testkit.WaitFor(t, 5*time.Second, "the owner to finish its stream", func() bool { return o.finished.Load() == 1 })
	if o.cutByPeer.Load() != 0 {
		t.Errorf("the owner's stream was cut")
	}
	testkit.WaitFor(t, 5*time.Second, "router 0's count on the owner to drop", func() bool { return ownInFlight(nodes[0], owner) == 0 })
	t.Logf("stream open on %s through router 0 when drained through router 1 (epoch %d): delivered %d/%d events; 30 new requests and 3 new streams with the prefix went to %s",
		owner, epoch, len(got), want, successor)
}

func ownInFlight(n *Node, id string) int64 {
	for _, s := range n.proxy.Status() {
		if s.ID == id {
			return s.InFlight
		}
	}
	return -1
}
