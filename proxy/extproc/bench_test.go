package extproc

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadtest/eppclient"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// testServer serves a picker over n backends on a loopback listener.
func testServer(tb testing.TB, n int) (*Server, string) {
	tb.Helper()
	pc := proxy.DefaultConfig()
	pc.ProbePath = ""
	p, err := proxy.New(pc)
	if err != nil {
		tb.Fatal(err)
	}
	var bs []ring.Backend
	for i := range n {
		addr := fmt.Sprintf("10.0.0.%d:8000", i+1)
		bs = append(bs, ring.Backend{ID: addr, Addr: "http://" + addr, State: ring.Active})
	}
	r, err := ring.New(ring.DefaultConfig(), bs)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.SetRing(r, 1); err != nil {
		tb.Fatal(err)
	}
	s, err := New(DefaultConfig(), p)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go s.Serve(ln)
	tb.Cleanup(func() { s.Shutdown(context.Background()) })
	return s, ln.Addr().String()
}

// BenchmarkProcess is one request's whole stream through the picker, as
// the gateway drives it: headers, a 4 KiB body, the decision and the body
// passed back, response headers with the served report, end. Plaintext on
// loopback; client and server share the machine.
func BenchmarkProcess(b *testing.B) {
	_, addr := testServer(b, 8)
	c, err := eppclient.Dial(addr, true)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := []byte(fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, strings.Repeat("context ", 500)))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		x, err := c.Pick(ctx, &eppclient.Request{Body: body, ChunkSize: 64 << 10})
		if err != nil || len(x.Answer.Endpoints) == 0 {
			b.Fatal(err, x.Answer)
		}
		if _, err := x.Finish(&eppclient.Response{Served: x.Answer.Endpoints[0], Status: 200, ContentType: "application/json"}); err != nil {
			b.Fatal(err)
		}
	}
}
