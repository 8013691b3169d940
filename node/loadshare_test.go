package node

import (
	"math"
	"testing"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/proxy/engine"
)

// TestEngineQueueFromScrape checks what a scrape, local or gossiped, hands
// the proxy's busy estimate: the queue rounded up and bounded whatever the
// engine sent, and nothing when the scrape failed or has no queue figure.
func TestEngineQueueFromScrape(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		waiting float64
		want    int64
	}{
		{0, 0}, {-3, 0}, {math.NaN(), 0}, {0.25, 1}, {2, 2}, {2.5, 3},
		{1e300, gossip.MaxEngineRequests}, {math.Inf(1), gossip.MaxEngineRequests},
	} {
		local := engineQueue(engine.Stats{OK: true, Known: engine.KnownWaiting, Waiting: c.waiting, Scraped: now})
		remote := gossipQueue(gossip.EngineStats{OK: true, Known: gossip.EngineWaiting, Waiting: c.waiting, Scraped: now})
		want := proxy.EngineQueue{Waiting: c.want, Scraped: now}
		if local != want || remote != want {
			t.Errorf("waiting %v: local %+v, gossiped %+v, want %+v", c.waiting, local, remote, want)
		}
	}
	// The prefix-cache hit rate comes along when the engine exports one
	// in range; otherwise it is not known.
	for _, c := range []struct {
		rate float64
		ok   bool
	}{{0, true}, {0.9, true}, {1, true}, {-0.1, false}, {1.5, false}, {math.NaN(), false}} {
		local := engineQueue(engine.Stats{OK: true, Known: engine.KnownWaiting | engine.KnownPrefixHitRate, PrefixHitRate: c.rate, Scraped: now})
		remote := gossipQueue(gossip.EngineStats{OK: true, Known: gossip.EngineWaiting | gossip.EnginePrefixHitRate, PrefixHitRate: c.rate, Scraped: now})
		want := proxy.EngineQueue{Scraped: now}
		if c.ok {
			want.PrefixHit, want.HasPrefixHit = c.rate, true
		}
		if local != want || remote != want {
			t.Errorf("hit rate %v: local %+v, gossiped %+v, want %+v", c.rate, local, remote, want)
		}
	}
	for name, q := range map[string]proxy.EngineQueue{
		"failed scrape":     engineQueue(engine.Stats{Known: engine.KnownWaiting, Waiting: 4, Scraped: now}),
		"no queue figure":   engineQueue(engine.Stats{OK: true, Known: engine.KnownRunning, Waiting: 4, Scraped: now}),
		"gossiped, failed":  gossipQueue(gossip.EngineStats{Known: gossip.EngineWaiting, Waiting: 4, Scraped: now}),
		"gossiped, unknown": gossipQueue(gossip.EngineStats{OK: true, Known: gossip.EngineKVUsage, Waiting: 4, Scraped: now}),
		"no figures":        gossipQueue(gossip.EngineStats{}),
	} {
		if q != (proxy.EngineQueue{}) {
			t.Errorf("%s: %+v, want none", name, q)
		}
	}
}
