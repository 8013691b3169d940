package gossip

import "time"

// LocalSource is implemented by the proxy: it appends its own exact
// in-flight count and local health verdict for every backend it knows
// (zero included) to dst and returns the extended slice. It is called from one goroutine every
// ChangeDelay (5 ms), so it must be cheap and must not block; reporting the
// backends in the same order each time lets an unchanged reading be
// recognised without a map lookup.
type LocalSource interface {
	AppendInFlight(dst []BackendLoad) []BackendLoad
}

// BackendLoad is one node's in-flight request count for one backend, and
// whether that node sees the backend failing (its own health checks or
// passive ejection). The Raft leader counts these verdicts when it
// commits a backend down or up.
type BackendLoad struct {
	Backend  string
	InFlight int64
	Failing  bool
}

// EngineStats is what a backend's inference engine reports about itself,
// as scraped from its Prometheus metrics by the node that owns the
// backend. Known says which of the figures the engine exports (TGI, for
// example, has no KV-cache figure); an unknown figure is zero. Its fields
// and the Engine* bits of Known mirror proxy/engine.Stats and its Known*
// bits, which gossip does not import: the node copies a scrape into an
// EngineStats field by field (node/loadshare.go, toGossip), so a figure
// added to one type must be added to the other and to that copy.
type EngineStats struct {
	KVUsage       float64 // KV-cache blocks in use, 0..1
	Running       float64 // requests being processed
	Waiting       float64 // requests queued in the engine
	PrefixHitRate float64 // prefix-cache hit rate, 0..1
	Known         uint8   // EngineKVUsage | EngineRunning | ...
	// Scraped is when the figures were read, on this node's clock (a
	// remote scrape's time is derived from its age on arrival).
	Scraped time.Time
	// OK is false when the last scrape failed; the figures are then zero.
	OK bool
}

// Has reports whether all the figures in bits are known and the scrape
// succeeded.
func (s EngineStats) Has(bits uint8) bool { return s.OK && s.Known&bits == bits }

// Member is one live node of the cluster.
type Member struct {
	Name  string
	Addr  string // gossip host:port
	Meta  Meta
	State string // "alive" or "suspect"
	Self  bool
	// Proven: with an Identity, the member proved its name with a
	// certificate of the cluster CA (this node: always). Without one,
	// false.
	Proven bool
}
