package proxy

import (
	"context"
	"net"
	"testing"
	"time"
)

// A Shutdown that came before Serve had handed its listener to fasthttp
// left Serve accepting for ever (fasthttp's Shutdown closes only the
// listeners it knows of), so a node stopped right after it started leaked
// its server goroutine and kept its port open. Serve after Shutdown now
// returns at once and closes the listener, and the prober does not start.
func TestServeAfterShutdownReturns(t *testing.T) {
	cfg := testProxyConfig()
	cfg.ProbePath = "/health"
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		ln.Close() // let the goroutine end, so the leak check reports only this
		<-done
		t.Fatal("Serve after Shutdown still accepting after 10 s")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts after Serve returned")
	}
	p.mu.Lock()
	started := p.proberStarted
	p.mu.Unlock()
	if started {
		t.Fatal("the prober started after Shutdown")
	}
}
