package gossip_test

import (
	"context"
	"log"
	"sync/atomic"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/proxy/engine"
)

// proxyCounters stands for the proxy's per-backend atomics.
type proxyCounters struct {
	ids    []string
	own    []atomic.Int64 // this node's exact in-flight
	remote []atomic.Int64 // other nodes' sum, pushed from the View
}

func (p *proxyCounters) AppendInFlight(dst []gossip.BackendLoad) []gossip.BackendLoad {
	for i, id := range p.ids {
		dst = append(dst, gossip.BackendLoad{Backend: id, InFlight: p.own[i].Load()})
	}
	return dst
}

// How a node wires a Mesh: the proxy's counters are the LocalSource;
// on every View change the remote sums go into the proxy's atomics, so
// the request path reads global in-flight (own + remote) without a lock;
// the engine scraper scrapes only the backends this node owns and shares
// what it reads.
func Example() {
	ids := []string{"gpu-a/", "gpu-b/"}
	counters := &proxyCounters{ids: ids, own: make([]atomic.Int64, 2), remote: make([]atomic.Int64, 2)}

	cfg := gossip.DefaultConfig()
	cfg.NodeName = "router-1"
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
	cfg.Meta = gossip.Meta{AdminAddr: "127.0.0.1:9090", RaftAddr: "127.0.0.1:7000"}
	c, err := gossip.New(cfg, counters)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	changes, cancel := c.Subscribe()
	defer cancel()
	go func() {
		for range changes { // closed by Close
			v := c.View()
			for i, id := range ids {
				counters.remote[i].Store(v.RemoteInFlight(id))
			}
		}
	}()

	targets := func() []engine.Target {
		return []engine.Target{{ID: "gpu-a/", MetricsURL: "http://127.0.0.1:8001/metrics"}}
	}
	scraper, err := engine.New(engine.DefaultConfig(), targets, c.IsScraper, func(id string, s engine.Stats) {
		c.PublishEngine(id, gossip.EngineStats(s)) // same layout
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go scraper.Run(ctx)
}
