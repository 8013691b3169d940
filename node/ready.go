package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
)

// Readiness of a router in a cluster. Until it has applied a state agreed
// under a Raft leader it can name, a router knows only its own config
// file: routing on that (epoch 0) would send prefixes where no other
// router sends them, and a router that never joined (a certificate of
// another CA, no cluster TLS, --bootstrap-expect with too few peers) would
// do so for good. So the proxy is held (503 not_ready on every request
// bound for a backend, /readyz and /ping 503 with the reason) until then,
// and the router says what it waits for: at once at INFO, then as a WARN
// after waitWarnAfter and every waitWarnEvery. Once ready it stays ready:
// a router that loses its leader keeps routing on the last agreed ring
// (docs/cluster.md, "Ready once agreed; then routing never waits on
// Raft"), so an election never takes the fleet out of service. A router
// alone (no gossip) runs a Raft group of its own in memory and is never
// held.
const (
	// readyCheckEvery is how often a waiting router looks again (besides
	// every applied change).
	readyCheckEvery = 200 * time.Millisecond
	// waitWarnAfter is how long a router may wait before it warns:
	// routers started together agree within a few seconds.
	waitWarnAfter = 10 * time.Second
	// waitWarnEvery is how often it warns again while it waits.
	waitWarnEvery = 30 * time.Second
	// waitProbeAfter is when a router kept out starts probing its peers
	// to tell why (routers started together pass each other's probes in
	// their first seconds); waitProbeEvery how often it probes again.
	waitProbeAfter = 3 * time.Second
	waitProbeEvery = 10 * time.Second
	// maxWaitProbes bounds the peers probed in one round (at once, each
	// within the Raft handshake timeout).
	maxWaitProbes = 4
	// maxNamesListed bounds the router names a reason lists; maxErrText
	// the length of a probe error in it.
	maxNamesListed = 8
	maxErrText     = 300
)

// notReadyPrefix starts every reason a held router gives.
const notReadyPrefix = "not ready: "

// waitView is what a waiting router knows, for waiting.
type waitView struct {
	self   string
	expect int      // --bootstrap-expect
	seeds  []string // --join
	tls    bool     // this router has a cluster certificate
	// members are gossip's live members, this router included.
	members []gossip.Member
	raft    cluster.Status
	// failed are the peers whose identity probe failed, by name, with
	// their address and error; probed is whether a round ran.
	failed map[string]string
	probed bool
}

// agreed reports whether the router has applied a seeded state under a
// leader it names: the leader is known, told it what is committed, and
// the state machine has applied all of that.
func (v *waitView) agreed() bool {
	r := &v.raft
	return r.Seeded && r.LeaderID != "" && r.CommitIndex > 0 && r.AppliedIndex >= r.CommitIndex
}

// others are the live gossip members other than this router.
func (v *waitView) others() []gossip.Member {
	var out []gossip.Member
	for _, m := range v.members {
		if !m.Self && m.Name != v.self {
			out = append(out, m)
		}
	}
	return out
}

// waiting says what the router waits for, or "" once agreed.
func (v *waitView) waiting() string {
	if v.agreed() {
		return ""
	}
	r := &v.raft
	others := v.others()
	var b strings.Builder
	switch {
	case r.LeaderID != "":
		fmt.Fprintf(&b, "waiting for the agreed state from the Raft leader %s (applied %d of %d committed entries)", r.LeaderID, r.AppliedIndex, r.CommitIndex)
		return b.String()
	case len(r.Servers) > 0:
		ids := make([]string, len(r.Servers))
		for i, s := range r.Servers {
			ids[i] = s.ID
		}
		fmt.Fprintf(&b, "waiting for a Raft leader: the Raft configuration holds %s; this router is %s at term %d and no leader has contacted it",
			listNames(ids), strings.ToLower(r.RaftState), r.Term)
	case v.expect == 1:
		b.WriteString("bootstrapping a new cluster alone (--bootstrap-expect 1)")
		return b.String()
	case len(others) == 0 && len(v.seeds) == 0:
		b.WriteString("no other router in gossip, and no --join seeds to find one")
		if v.expect > 1 {
			fmt.Fprintf(&b, "; --bootstrap-expect %d needs %d routers that join one another", v.expect, v.expect)
		}
	case len(others) == 0:
		fmt.Fprintf(&b, "gossip has reached none of the --join seeds (%s); the log names each seed's failure", listNames(v.seeds))
	case v.expect > 0:
		eligible := 0
		var names []string
		for _, m := range v.members {
			if m.Meta.Voter || m.Self || m.Name == v.self {
				eligible++
				names = append(names, m.Name)
			}
		}
		if eligible < v.expect {
			fmt.Fprintf(&b, "waiting for %d routers to form a new cluster (--bootstrap-expect %d); gossip shows %d that may vote: %s",
				v.expect, v.expect, eligible, listNames(names))
		} else {
			fmt.Fprintf(&b, "%d routers that may vote are in gossip (%s) but have not formed a cluster: each must answer the others' identity probes",
				eligible, listNames(names))
		}
	default:
		names := make([]string, len(others))
		for i, m := range others {
			names[i] = m.Name
		}
		fmt.Fprintf(&b, "waiting to be added to the Raft configuration by the cluster's leader; gossip shows %s", listNames(names))
		v.writeProbes(&b, true)
		return b.String()
	}
	v.writeProbes(&b, false)
	return b.String()
}

// writeProbes adds the failed identity probes to a reason, with what
// they usually mean; kept: the router waits to be added, so probes that
// all passed point at the leader.
func (v *waitView) writeProbes(b *strings.Builder, kept bool) {
	if len(v.failed) == 0 {
		if kept && v.probed {
			b.WriteString("; this router's identity probes of its peers pass, so see the leader's log for why it is kept out")
		}
		return
	}
	for _, n := range slices.Sorted(maps.Keys(v.failed)) {
		fmt.Fprintf(b, "; the identity probe of %s failed: %s", n, v.failed[n])
	}
	if v.tls {
		b.WriteString(" (a TLS or certificate failure means the routers do not share a cluster CA: " +
			"check this router's --cluster-tls-ca-file and certificate against the others')")
	} else {
		b.WriteString(" (this router has no cluster TLS: routers with cluster certificates refuse it; " +
			"give it a certificate of the cluster CA with --cluster-tls-cert-file, --cluster-tls-key-file and --cluster-tls-ca-file)")
	}
}

// listNames joins names, at most maxNamesListed of them.
func listNames(names []string) string {
	if len(names) <= maxNamesListed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxNamesListed], ", "), len(names)-maxNamesListed)
}

// wantsProbes reports whether probing the peers may explain the wait: no
// leader has reached this router, and gossip shows others.
func (v *waitView) wantsProbes() bool {
	return v.raft.LeaderID == "" && len(v.others()) > 0
}

// probeTargets are the peers a probe round asks: up to maxWaitProbes
// live members with a Raft address, by name.
func (v *waitView) probeTargets() []gossip.Member {
	var out []gossip.Member
	for _, m := range v.others() {
		if m.Meta.RaftAddr != "" && len(out) < maxWaitProbes {
			out = append(out, m)
		}
	}
	return out
}

// peerProber is the probe a waiting router runs (*cluster.Agreement).
type peerProber interface {
	ProbePeer(id, addr string) error
}

var _ peerProber = (*cluster.Agreement)(nil)

// probePeers probes targets at once and returns the failures: "address:
// error" by name, each error cut to maxErrText bytes.
func probePeers(p peerProber, targets []gossip.Member) map[string]string {
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed = map[string]string{}
	)
	for _, m := range targets {
		wg.Go(func() {
			if err := p.ProbePeer(m.Name, m.Meta.RaftAddr); err != nil {
				msg := err.Error()
				if len(msg) > maxErrText {
					msg = msg[:maxErrText] + "..."
				}
				mu.Lock()
				failed[m.Name] = "at " + m.Meta.RaftAddr + ": " + msg
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// awaitAgreement holds the proxy until this router has applied the state
// agreed under a leader it names, saying what it waits for, then lets it
// route and returns; also when ctx ends. Cluster mode only.
func (n *Node) awaitAgreement(ctx context.Context) {
	ch, cancel := n.agree.Subscribe()
	defer cancel()
	tick := time.NewTicker(readyCheckEvery)
	defer tick.Stop()
	start := time.Now()
	nextProbe, nextWarn := start.Add(waitProbeAfter), start.Add(waitWarnAfter)
	v := waitView{self: n.name, expect: n.cfg.Cluster.BootstrapExpect, seeds: n.cfg.Cluster.Join, tls: n.identity != nil}
	announced := false
	for {
		v.members, v.raft = n.gossip.Members(), n.agree.Status()
		now := time.Now()
		if !v.agreed() && v.wantsProbes() && now.After(nextProbe) {
			v.failed, v.probed = probePeers(n.agree, v.probeTargets()), true
			now = time.Now()
			nextProbe = now.Add(waitProbeEvery)
			v.members, v.raft = n.gossip.Members(), n.agree.Status()
		}
		reason := v.waiting()
		if reason == "" {
			n.proxy.Hold("")
			n.agreed.Store(true)
			n.log.Info("router ready: it routes on the agreed state", "leader", v.raft.LeaderID, "epoch", v.raft.Epoch,
				"waited", now.Sub(start).Round(time.Millisecond))
			return
		}
		n.proxy.Hold(notReadyPrefix + reason)
		switch {
		case !announced:
			announced = true
			n.log.Info("not ready until this router applies the state agreed under a Raft leader", "waiting_for", reason)
		case now.After(nextWarn):
			nextWarn = now.Add(waitWarnEvery)
			n.log.Warn(notReadyPrefix+reason, "waiting", now.Sub(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-tick.C:
		}
	}
}
