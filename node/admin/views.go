package admin

import (
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// The documents the admin API serves, shared by the Server and the Client.

// Status is GET /status: what this router routes on now.
type Status struct {
	Node  string `json:"node"`
	Epoch uint64 `json:"epoch"`
	// Routing is the ring's settings; PartitionCount is the count in use
	// (also when the setting is 0, automatic).
	Routing  ring.Settings     `json:"routing"`
	Ready    bool              `json:"ready"`
	Backends []BackendLiveView `json:"backends"`
	Members  []gossip.Member   `json:"members,omitempty"`
	Raft     *cluster.Status   `json:"raft,omitempty"`
	// Halted says why this router stopped applying the Raft log, when it
	// did (it is then not ready).
	Halted string `json:"halted,omitempty"`
	// Splits are the prompt prefixes that carry too much traffic for one
	// backend: ADAPTIVE keys route one block past them.
	Splits []ring.Split `json:"splits,omitempty"`
	// MovedPartitions is how many partitions the balancer gave another
	// owner in the ring in use.
	MovedPartitions int `json:"moved_partitions"`
	// Cache is this router's cache predictions against what the answers
	// delivered, per decision kind, summed over the backends (each
	// backend's own are in its cache field).
	Cache []proxy.CacheFigures `json:"cache,omitempty"`
}

// BackendLiveView is a backend in /status: this router's live view of it
// and what its engine last reported.
type BackendLiveView struct {
	proxy.BackendStatus
	Engine *EngineFigures `json:"engine,omitempty"`
}

// EngineFigures is what a backend's inference engine last reported about
// itself in its Prometheus metrics, as one router scraped them (in a
// cluster each backend is scraped by one router and the figures are
// shared by gossip). A figure the engine does not export is left out (TGI
// has no KV-cache figure, for one); so are all of them when the last
// scrape failed (OK false).
type EngineFigures struct {
	// KVUsage is the share of KV-cache blocks in use, 0..1.
	KVUsage *float64 `json:"kv_usage,omitempty"`
	// Running and Waiting are the requests the engine is processing and
	// those it queues.
	Running *float64 `json:"running,omitempty"`
	Waiting *float64 `json:"waiting,omitempty"`
	// PrefixHitRate is the prefix-cache hit rate, 0..1 (over the last
	// 10 s for engines that export hit and query counters).
	PrefixHitRate *float64  `json:"prefix_hit_rate,omitempty"`
	ScrapedAt     time.Time `json:"scraped_at"`
	OK            bool      `json:"ok"`
}

// engineFigures converts what gossip carries.
func engineFigures(s gossip.EngineStats) *EngineFigures {
	f := &EngineFigures{ScrapedAt: s.Scraped, OK: s.OK}
	if !s.OK {
		return f
	}
	known := func(bit uint8, v float64) *float64 {
		if s.Known&bit == 0 {
			return nil
		}
		return &v
	}
	f.KVUsage = known(gossip.EngineKVUsage, s.KVUsage)
	f.Running = known(gossip.EngineRunning, s.Running)
	f.Waiting = known(gossip.EngineWaiting, s.Waiting)
	f.PrefixHitRate = known(gossip.EnginePrefixHitRate, s.PrefixHitRate)
	return f
}

// BackendView is a backend as the admin API shows it: the agreed record
// and this router's live view of it.
type BackendView struct {
	cluster.Backend
	Live *proxy.BackendStatus `json:"live,omitempty"`
	// Engine is what the backend's engine last reported (no scrape yet,
	// or scraping off: nil).
	Engine *EngineFigures `json:"engine,omitempty"`
	// FailingOn names the other routers that see the backend failing
	// (their health checks or passive ejection, as gossip carries it); the
	// leader commits it down when most routers do.
	FailingOn []string `json:"failing_on,omitempty"`
}

// BackendList is GET /v1/backends.
type BackendList struct {
	Epoch    uint64        `json:"epoch"`
	Backends []BackendView `json:"backends"`
}

// BackendDoc is GET /v1/backends/{id}.
type BackendDoc struct {
	Epoch   uint64      `json:"epoch"`
	Backend BackendView `json:"backend"`
}

// BackendRequest is the body of POST /v1/backends. ID defaults to the
// URL's host:port; an empty State keeps the backend's (active when new).
type BackendRequest struct {
	ID     string            `json:"id,omitempty"`
	URL    string            `json:"url"`
	Zone   string            `json:"zone,omitempty"`
	Weight int               `json:"weight,omitempty"`
	State  string            `json:"state,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Models declares what the backend serves until its /v1/models
	// answers (omitted: kept, or learned from that alone).
	Models []string `json:"models,omitempty"`
}

// ConfigDoc is GET /v1/config.
type ConfigDoc struct {
	Epoch   uint64        `json:"epoch"`
	Routing ring.Settings `json:"routing"`
}

// WriteResult is the answer to a write: the epoch of the state it produced
// and the router that answered (the leader, when the write was
// forwarded).
type WriteResult struct {
	Epoch uint64 `json:"epoch"`
	Node  string `json:"node"`
}

// ClusterView is GET /v1/cluster.
type ClusterView struct {
	Node    string         `json:"node"`
	Epoch   uint64         `json:"epoch"`
	Raft    cluster.Status `json:"raft"`
	Members []MemberView   `json:"members,omitempty"`
	Leader  string         `json:"leader,omitempty"`
}

// MemberView is one router as gossip shows it. State is "refused" when
// this router's identity probe refuses the member (Reason says why): it
// is in gossip, which any holder of the gossip key can join, but it did
// not prove its name, and it gets no Raft seat, address or vote.
type MemberView struct {
	Name      string `json:"name"`
	Addr      string `json:"addr"`
	State     string `json:"state"`
	Reason    string `json:"reason,omitempty"`
	Zone      string `json:"zone,omitempty"`
	AdminAddr string `json:"admin_addr,omitempty"`
	RaftAddr  string `json:"raft_addr,omitempty"`
	Version   string `json:"version,omitempty"`
}

// Explanation is the /debug/route answer: where a request would go, and
// why.
type Explanation struct {
	Node         string `json:"node"`
	Epoch        uint64 `json:"epoch"`
	API          string `json:"api"`
	Key          string `json:"key"`
	PrefixBytes  int    `json:"prefix_bytes"`
	Model        string `json:"model,omitempty"`
	TenantSource string `json:"tenant_source,omitempty"`
	// KeySource is "session" when the session header keyed the request
	// (empty: its prompt did).
	KeySource string `json:"key_source,omitempty"`
	ring.Explanation
}

// MemberRefused is the State of a member this router's identity probe
// refuses.
const MemberRefused = "refused"

// Revocations is GET /v1/revocations: the agreed revocation list.
type Revocations struct {
	Epoch   uint64   `json:"epoch"`
	Names   []string `json:"names"`
	Serials []string `json:"serials"`
}

// RevocationRequest is the body of POST /v1/revocations (revoke) and
// DELETE /v1/revocations (take off the list): router names and
// certificate serial numbers (hex, as 'warmroute tls show' prints them).
type RevocationRequest struct {
	Names   []string `json:"names,omitempty"`
	Serials []string `json:"serials,omitempty"`
}
