package cluster

import (
	"errors"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	commitSeconds    prometheus.Histogram
	leaderChanges    prometheus.Counter
	reconcileActions *prometheus.CounterVec
	healthCommits    *prometheus.CounterVec
	discoveryPolls   *prometheus.CounterVec
	raftRefused      *prometheus.CounterVec
	raftForeign      prometheus.Counter
	probeRefused     prometheus.Counter
	rpcRefused       *prometheus.CounterVec
	fsmHalted        prometheus.Gauge
	versionSkew      prometheus.Counter
	all              []prometheus.Collector
}

func newMetrics(c *Agreement) *metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "warmroute", Subsystem: "raft", Name: name, Help: help}
	}
	m := &metrics{
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "warmroute", Subsystem: "raft", Name: "commit_seconds",
			Help:    "Time from handing a write to Raft on the leader until this node applied it.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		leaderChanges:    prometheus.NewCounter(prometheus.CounterOpts(opts("leader_changes_total", "Changes of Raft leader this node observed."))),
		reconcileActions: prometheus.NewCounterVec(prometheus.CounterOpts(opts("reconcile_actions_total", "Raft membership changes made by this node as leader (and its bootstrap), by action.")), []string{"action"}),
		healthCommits:    prometheus.NewCounterVec(prometheus.CounterOpts(opts("health_commits_total", "Backend state changes committed from health reports, by new state.")), []string{"state"}),
		discoveryPolls:   prometheus.NewCounterVec(prometheus.CounterOpts(opts("discovery_polls_total", "DNS discovery lookups by this node as leader, by result.")), []string{"result"}),
		raftRefused: prometheus.NewCounterVec(prometheus.CounterOpts(opts("connections_refused_total",
			"Inbound Raft connections closed before Raft saw them, by reason (limit, limit_per_ip, tls, identity, preamble, foreign_cluster).")), []string{"reason"}),
		raftForeign: prometheus.NewCounter(prometheus.CounterOpts(opts("foreign_peers_total",
			"Raft connections (either way) with a router whose data belong to another cluster."))),
		probeRefused: prometheus.NewCounter(prometheus.CounterOpts(opts("probes_refused_total",
			"Identity probes of gossip members (and configured Raft servers) that something answered without proving the member's name or cluster; the member gets no Raft seat, address or vote."))),
		rpcRefused: prometheus.NewCounterVec(prometheus.CounterOpts(opts("rpcs_refused_total",
			"Raft RPCs refused (and their connection closed) on an authenticated connection, by reason (rpc_id, rpc_addr, not_member, revoked, malformed).")), []string{"reason"}),
		versionSkew: prometheus.NewCounter(prometheus.CounterOpts(opts("version_skew_refusals_total",
			"Writes this node refused as leader because a router advertises an older command level than the write needs (upgrade every router; see the error)."))),
		fsmHalted: prometheus.NewGauge(prometheus.GaugeOpts(opts("fsm_halted",
			"1 when this router stopped applying the Raft log: its copy of a committed entry is damaged or foreign (see the log)."))),
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts(name, help)), f)
	}
	stateGauge := prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("state", "1 for this node's current Raft state (leader, follower, candidate, shutdown).")), []string{"state"})
	m.all = []prometheus.Collector{
		m.commitSeconds, m.leaderChanges, m.reconcileActions, m.healthCommits, m.discoveryPolls,
		m.raftRefused, m.raftForeign, m.probeRefused, m.rpcRefused, m.fsmHalted, m.versionSkew,
		stateCollector{c: c, g: stateGauge},
		gauge("epoch", "Index of the Raft entry that produced the applied state (the ring epoch).",
			func() float64 { return float64(c.fsm.view().epoch) }),
		gauge("applied_index", "Raft's last applied log index on this node.",
			func() float64 { return float64(c.raft.AppliedIndex()) }),
		gauge("term", "Raft's current term on this node.",
			func() float64 { return float64(c.raft.CurrentTerm()) }),
		gauge("last_contact_seconds", "Seconds since this follower last heard from the leader (0 on the leader).",
			func() float64 {
				if c.raft.State() == raft.Leader {
					return 0
				}
				t := c.raft.LastContact()
				if t.IsZero() {
					return 0
				}
				return time.Since(t).Seconds()
			}),
	}
	return m
}

func stateLabel(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	}
	return "shutdown"
}

// stateCollector sets the one-hot state gauge from Raft at scrape time.
type stateCollector struct {
	c *Agreement
	g *prometheus.GaugeVec
}

func (s stateCollector) Describe(ch chan<- *prometheus.Desc) { s.g.Describe(ch) }

func (s stateCollector) Collect(ch chan<- prometheus.Metric) {
	cur := s.c.raft.State()
	for _, st := range []raft.RaftState{raft.Leader, raft.Follower, raft.Candidate, raft.Shutdown} {
		v := 0.0
		if st == cur {
			v = 1
		}
		s.g.WithLabelValues(stateLabel(st)).Set(v)
	}
	s.g.Collect(ch)
}

func (m *metrics) register(r prometheus.Registerer) error {
	for i, col := range m.all {
		if err := r.Register(col); err != nil {
			for _, done := range m.all[:i] {
				r.Unregister(done)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return errors.New("cluster: metrics already registered (one Agreement per registry)")
			}
			return err
		}
	}
	return nil
}

func (m *metrics) unregister(r prometheus.Registerer) {
	for _, col := range m.all {
		r.Unregister(col)
	}
}
