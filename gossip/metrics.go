package gossip

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats are a Mesh's running totals since New.
type Stats struct {
	MessagesSent     uint64 // load/engine/bye packets sent (one per peer)
	BytesSent        uint64 // their payload bytes
	MessagesReceived uint64 // load/engine/bye packets and push/pull states received
	BytesReceived    uint64 // their payload bytes
	SendErrors       uint64
	Malformed        uint64 // messages that did not decode
	UnknownSender    uint64 // blocks from nodes that are not members
	Stale            uint64 // blocks from an older run of a node, or after its bye
	WirePacketBytes  uint64 // all UDP bytes memberlist sent, ours included
	WireStreamBytes  uint64 // all TCP bytes memberlist sent (push/pull, joins)
	ViewUpdates      uint64
	// Rejected counts messages, figures and members refused, by reason
	// (the label of warmroute_gossip_rejected_total): "unsigned",
	// "unknown_key", "bad_chain", "wrong_name", "bad_signature",
	// "chain_rate_limited", "clock_skew", "revoked" (messages, with an
	// Identity; a chain revoked after it was cached counts as
	// "bad_signature");
	// "out_of_range", "too_many_backends" (figures); "bad_member_name"
	// (members); "state_too_large" (push/pull states); "stream_limit" (TCP
	// streams over the listener's caps).
	Rejected map[string]uint64
}

type counters struct {
	msgsSent, bytesSent, msgsRecv, bytesRecv atomic.Uint64
	sendErrors, malformed, viewUpdates       atomic.Uint64
}

// Stats returns the Mesh's running totals.
func (c *Mesh) Stats() Stats {
	unknown, stale := c.st.counters()
	st := Stats{
		MessagesSent:     c.cnt.msgsSent.Load(),
		BytesSent:        c.cnt.bytesSent.Load(),
		MessagesReceived: c.cnt.msgsRecv.Load(),
		BytesReceived:    c.cnt.bytesRecv.Load(),
		SendErrors:       c.cnt.sendErrors.Load(),
		Malformed:        c.cnt.malformed.Load(),
		UnknownSender:    unknown,
		Stale:            stale,
		WirePacketBytes:  c.tr.packetBytes.Load(),
		WireStreamBytes:  c.tr.streamBytes.Load(),
		ViewUpdates:      c.cnt.viewUpdates.Load(),
		Rejected:         make(map[string]uint64, numRejects),
	}
	for r := range numRejects {
		st.Rejected[r.String()] = c.st.rej[r].Load()
	}
	return st
}

// newCollectors returns the Mesh's Prometheus metrics. Own and global
// in-flight per backend belong to the proxy's counters plus View and are
// exported by the node.
func (c *Mesh) newCollectors() []prometheus.Collector {
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "warmroute", Subsystem: "gossip", Name: name, Help: help,
		}, func() float64 { return float64(f()) })
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "warmroute", Subsystem: "gossip", Name: name, Help: help,
		}, f)
	}
	cols := []prometheus.Collector{
		gauge("members", "Live members of the router cluster, this node included (with an Identity, those that proved their name).",
			func() float64 { return float64(len(c.View().members)) }),
		gauge("oldest_remote_figure_age_seconds", "Age of the oldest in-flight figure from another node still counted.",
			func() float64 { return c.st.oldestAge(time.Now()).Seconds() }),
		gauge("change_interval_seconds", "Shortest time between two publishes of changed figures: ChangeDelay, longer in a large cluster (ChangeBudget).",
			func() float64 { return c.changeInterval().Seconds() }),
		counter("messages_sent_total", "Load and engine messages sent (one per peer).", c.cnt.msgsSent.Load),
		counter("bytes_sent_total", "Payload bytes of load and engine messages sent.", c.cnt.bytesSent.Load),
		counter("messages_received_total", "Load and engine messages and push/pull states received.", c.cnt.msgsRecv.Load),
		counter("bytes_received_total", "Payload bytes of load and engine messages and push/pull states received.", c.cnt.bytesRecv.Load),
		counter("send_errors_total", "Load messages that could not be sent.", c.cnt.sendErrors.Load),
		counter("malformed_messages_total", "Received messages that did not decode.", c.cnt.malformed.Load),
		counter("unknown_sender_total", "Received figures from nodes that are not members.", func() uint64 { u, _ := c.st.counters(); return u }),
		counter("stale_total", "Received figures from an older run of a node or after it said goodbye.", func() uint64 { _, s := c.st.counters(); return s }),
		counter("wire_packet_bytes_sent_total", "All UDP bytes sent by the gossip layer (probes, gossip, load).", c.tr.packetBytes.Load),
		counter("wire_stream_bytes_sent_total", "All TCP bytes sent by the gossip layer (push/pull, joins).", c.tr.streamBytes.Load),
		counter("view_updates_total", "Views built (figure or membership changes).", c.cnt.viewUpdates.Load),
	}
	for r := range numRejects {
		cols = append(cols, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "warmroute", Subsystem: "gossip", Name: "rejected_total",
			Help:        "Messages, figures and members from other nodes refused, by reason.",
			ConstLabels: prometheus.Labels{"reason": r.String()},
		}, func() float64 { return float64(c.st.rej[r].Load()) }))
	}
	return cols
}

// register registers the Mesh's metrics with Config.Registry, if any. When
// one is refused it unregisters those registered and says why.
func (c *Mesh) register() error {
	if c.cfg.Registry == nil {
		return nil
	}
	for _, col := range c.newCollectors() {
		if err := c.cfg.Registry.Register(col); err != nil {
			c.unregister()
			return fmt.Errorf("gossip: register metrics: %w", err)
		}
		c.registered = append(c.registered, col)
	}
	return nil
}

func (c *Mesh) unregister() {
	if c.cfg.Registry == nil {
		return
	}
	for _, col := range c.registered {
		c.cfg.Registry.Unregister(col)
	}
	c.registered = nil
}
