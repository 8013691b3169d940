package gossip

import "time"

// The figures the application shares through the Mesh and reads back from
// the other nodes: engine metrics, partition counts and hot prefixes. The
// publisher (publisher.go) holds what goes out; the state (state.go) what
// came in.

// IsScraper reports whether this node owns scraping backend's engine
// metrics right now (see View.Scraper).
func (c *Mesh) IsScraper(backend string) bool {
	return c.View().Scraper(backend) == c.cfg.NodeName
}

// PublishEngine records engine metrics this node scraped for backend and
// shares them with the other nodes. A zero s.Scraped means now.
func (c *Mesh) PublishEngine(backend string, s EngineStats) {
	if s.Scraped.IsZero() {
		s.Scraped = time.Now()
	}
	c.pub.setEngine(backend, s)
	c.st.setLocal(backend, s)
	c.signal()
}

// PublishPartitions shares this node's recent request counts per ring
// partition (loads, one per partition, in the caller's unit) with the
// other nodes: the busiest MaxPartEntries of at least min go out once,
// with the next publish. Call it about once a second from one goroutine;
// the Raft leader's balancer adds up every node's with PartitionLoads, so
// it decides from the whole cluster's traffic rather than its own share.
func (c *Mesh) PublishPartitions(loads []uint32, min uint32) {
	c.pub.setParts(loads, min)
}

// PartitionLoads adds to dst (one count per partition) the counts the
// other nodes published within maxAge for a ring of len(dst) partitions,
// and returns how many nodes it added.
func (c *Mesh) PartitionLoads(dst []uint64, maxAge time.Duration) int {
	return c.st.addParts(dst, maxAge, time.Now())
}

// PublishHot shares the prompt prefixes this node's own traffic calls to
// split, as the candidates of its hot-prefix counter, with the other
// nodes, once, with the next publish: at most MaxHotCounted of list
// (shallowest first as given) with their counts and routing partitions,
// out of total requests counted alike, on a ring of partitions
// partitions. Call it about twice a second while there are any; the Raft
// leader adds every node's counts up (HotReports) and splits a prefix
// only when its owner is pressed, so traffic that reaches only other
// routers counts too.
func (c *Mesh) PublishHot(total uint64, partitions int, list []HotPrefix) {
	if len(list) > 0 {
		c.pub.setHot(total, partitions, list)
	}
}

// PublishCost shares what this node's own traffic says of the recompute
// work unit with the other nodes, once, with the next publish. Call it
// about once a second; the Raft leader adds every node's up (CostReports)
// and commits the median, so every router weighs a move alike.
func (c *Mesh) PublishCost(f CostFigure) {
	c.pub.setCost(f)
}

// CostReport is one other node's last cost figure (PublishCost).
type CostReport struct {
	Node string
	CostFigure
}

// CostReports appends to dst the cost figures the other nodes published
// within maxAge.
func (c *Mesh) CostReports(dst []CostReport, maxAge time.Duration) []CostReport {
	return c.st.costReports(dst, maxAge, time.Now())
}

// HotReport is one other node's last counted hot prefixes (PublishHot),
// with the partition counts it published (PublishPartitions) for a ring
// of as many partitions, if fresh: the traffic its claims must be part of.
type HotReport struct {
	Node       string
	Total      uint64
	Partitions uint64
	Prefixes   []HotPrefix
	Parts      []PartLoad
}

// HotReports appends to dst the counted hot prefixes the other nodes
// published within maxAge, each with the partition counts the same node
// published within partsAge.
func (c *Mesh) HotReports(dst []HotReport, maxAge, partsAge time.Duration) []HotReport {
	return c.st.hotReports(dst, maxAge, partsAge, time.Now())
}
