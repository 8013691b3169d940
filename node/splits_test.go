package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// TestSplitsAgreedAcrossRouters loads three clustered routers with
// conversations that share a 3 KiB preamble. The leader must split the
// preamble, every router must install the same splits at the same epoch,
// the conversations must then spread over the backends while each stays on
// one, and routers at one epoch must agree on every decision.
func TestSplitsAgreedAcrossRouters(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	var urls []string
	for i := 0; i < 5; i++ {
		urls = append(urls, newHoldEngine(t, time.Millisecond).srv.URL)
	}
	nodes := startClusterRaft(t, 3, 300*time.Millisecond, func(i int, c *Config) { *c = testConfig(urls) })
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	if r, _ := nodes[0].proxy.Ring(); !r.Config().Adaptive() {
		t.Fatal("the default settings do not use ADAPTIVE keys")
	}
	preamble := strings.Repeat("Shared operating manual, version 7. ", 90) // 3,240 bytes
	prompt := func(conv int) string {
		return chat(preamble + fmt.Sprintf("conversation %d asks about item %d", conv, conv*7))
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for c := 0; c < 3; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 20000; i++ {
				_, _ = send("http://"+nodes[(c+i)%3].TrafficAddr().String(), prompt(i%120))
			}
		}()
	}
	// The preamble fills three blocks: all three must be split.
	start := time.Now()
	waitFor(t, 30*time.Second, "the preamble split on every router", func() bool {
		for _, n := range nodes {
			if len(n.proxy.Splits()) < 3 {
				return false
			}
		}
		return true
	})
	t.Logf("preamble split on all three routers %v after the load started", time.Since(start).Round(time.Millisecond))
	stop()
	wg.Wait()
	// Settled: the same splits and epoch everywhere.
	waitFor(t, 10*time.Second, "one epoch and one split set", func() bool {
		_, e0 := nodes[0].proxy.Ring()
		for _, n := range nodes[1:] {
			if _, e := n.proxy.Ring(); e != e0 || !slices.Equal(n.proxy.Splits(), nodes[0].proxy.Splits()) {
				return false
			}
		}
		return true
	})
	st, epoch := nodes[0].agree.State()
	if !slices.Equal(st.Splits, nodes[0].proxy.Splits()) {
		t.Fatalf("installed splits %v differ from the agreed %v at epoch %d", nodes[0].proxy.Splits(), st.Splits, epoch)
	}
	backends := map[string]int{}
	for conv := 0; conv < 120; conv++ {
		body := []byte(prompt(conv))
		var first string
		for j, n := range nodes {
			info, e, err := n.proxy.Explain(ring.Chat, body, nil)
			if err != nil {
				t.Fatal(err)
			}
			if info.PrefixBytes <= len(preamble) {
				t.Fatalf("conversation %d routes on %d bytes, inside the preamble", conv, info.PrefixBytes)
			}
			if j == 0 {
				first = e.Backend
			} else if e.Backend != first {
				t.Fatalf("conversation %d: %s says %s, router 0 says %s", conv, n.name, e.Backend, first)
			}
		}
		backends[first]++
	}
	if len(backends) < 4 {
		t.Fatalf("120 conversations on a split preamble went to %d of 5 backends: %v", len(backends), backends)
	}
	t.Logf("120 conversations over the split preamble: %v", backends)
}
