package admin

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/gossip"
)

// The engines' figures as this router knows them, per backend: scraped
// here or shared by the router that scraped them, so every router
// exports every backend's (aggregate with max by (backend)).
var (
	engineKVDesc = prometheus.NewDesc("warmroute_backend_engine_kv_usage",
		"Share of the engine's KV-cache blocks in use (0..1), as last scraped from its metrics.", []string{"backend"}, nil)
	engineRunningDesc = prometheus.NewDesc("warmroute_backend_engine_running",
		"Requests the engine reports it is processing.", []string{"backend"}, nil)
	engineWaitingDesc = prometheus.NewDesc("warmroute_backend_engine_waiting",
		"Requests the engine reports it queues.", []string{"backend"}, nil)
	engineHitDesc = prometheus.NewDesc("warmroute_backend_engine_prefix_hit_rate",
		"The engine's prefix-cache hit rate (0..1; over the last 10 s for engines that export counters).", []string{"backend"}, nil)
)

// engineCollector exports the engine figures of the backends in the ring
// in use, those the engine reports and a successful scrape found.
type engineCollector struct{ s *Server }

func (c engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{engineKVDesc, engineRunningDesc, engineWaitingDesc, engineHitDesc} {
		ch <- d
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.s.cfg.Router.Status() {
		es, ok := c.s.cfg.Engines.Engine(b.ID)
		if !ok || !es.OK {
			continue
		}
		for _, f := range []struct {
			bit  uint8
			desc *prometheus.Desc
			v    float64
		}{
			{gossip.EngineKVUsage, engineKVDesc, es.KVUsage},
			{gossip.EngineRunning, engineRunningDesc, es.Running},
			{gossip.EngineWaiting, engineWaitingDesc, es.Waiting},
			{gossip.EnginePrefixHitRate, engineHitDesc, es.PrefixHitRate},
		} {
			if es.Known&f.bit != 0 {
				ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, f.v, b.ID)
			}
		}
	}
}
