package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Resolver is the DNS lookups discovery needs; *net.Resolver implements
// it.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

var _ Resolver = (*net.Resolver)(nil)

// DiscoveryConfig configures DNS discovery of backends. The leader polls
// Name every Interval and makes the DNS-discovered backends exactly what
// DNS returns: new addresses are added (active), and backends it added
// that DNS stopped returning for two polls in a row are removed. Backends
// from the config file or the admin API are never touched. A failed lookup
// changes nothing.
type DiscoveryConfig struct {
	// Name is looked up for SRV records when it starts with '_' (for
	// example _http._tcp.vllm.default.svc.cluster.local, a headless
	// Kubernetes Service's named port), else for A/AAAA records (a headless
	// Service's name). Empty turns discovery off.
	Name string
	// Port is the backends' port for A/AAAA names (SRV records carry
	// their own).
	Port int
	// Scheme is http or https.
	Scheme string
	// Zone and Weight are given to every discovered backend.
	Zone   string
	Weight int
	// Interval is the polling period; Timeout bounds one lookup.
	Interval time.Duration
	Timeout  time.Duration
	// Resolver does the lookups; nil uses net.DefaultResolver.
	Resolver Resolver
	// Finder, when set, lists the backends instead of DNS (Kubernetes:
	// the pods of an InferencePool); Name then only names the source in
	// logs. What it finds is committed and retired like DNS answers.
	Finder Finder
}

// Finder lists the backends a discovery source names now. A source that
// does not exist yet yields none and no error; an error changes nothing.
type Finder interface {
	Find(ctx context.Context) ([]Backend, error)
}

// DefaultDiscoveryConfig returns discovery off, with a 10 s interval once a
// Name is set.
func DefaultDiscoveryConfig() DiscoveryConfig {
	return DiscoveryConfig{Scheme: "http", Interval: 10 * time.Second, Timeout: 5 * time.Second}
}

func (d *DiscoveryConfig) srv() bool { return strings.HasPrefix(d.Name, "_") }

func (d *DiscoveryConfig) validate() error {
	if d.Name == "" {
		return nil
	}
	if d.Finder != nil {
		if d.Interval <= 0 || d.Timeout <= 0 {
			return errors.New("interval and timeout must be positive")
		}
		return nil
	}
	switch {
	case d.Scheme != "http" && d.Scheme != "https":
		return fmt.Errorf("scheme %q: want http or https", d.Scheme)
	case !d.srv() && (d.Port < 1 || d.Port > 65535):
		return fmt.Errorf("port %d: an A/AAAA name needs a port in [1, 65535]", d.Port)
	case d.Interval <= 0 || d.Timeout <= 0:
		return errors.New("interval and timeout must be positive")
	case d.Weight < 0 || d.Weight > maxWeight:
		return fmt.Errorf("weight %d out of range [0, %d]", d.Weight, maxWeight)
	}
	return nil
}

// lookup returns the backends DNS names now, sorted by ID. A name that
// does not exist yields none (a headless Service with no ready pods).
func (d *DiscoveryConfig) lookup(ctx context.Context) ([]Backend, error) {
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	if d.Finder != nil {
		found, err := d.Finder.Find(ctx)
		if err != nil {
			return nil, err
		}
		// Found backends are kept and retired like DNS's (the Source
		// an older router in the cluster also accepts).
		out := make([]Backend, 0, len(found))
		for _, b := range found {
			b.Source = SourceDNS
			out = append(out, b)
		}
		slices.SortFunc(out, func(a, b Backend) int { return strings.Compare(a.ID, b.ID) })
		out = slices.CompactFunc(out, func(a, b Backend) bool { return a.ID == b.ID })
		return out, nil
	}
	var hostports []string
	if d.srv() {
		_, recs, err := r.LookupSRV(ctx, "", "", d.Name)
		if err != nil {
			if !isNotFound(err) {
				return nil, err
			}
			recs = nil
		}
		for _, s := range recs {
			host := strings.TrimSuffix(s.Target, ".")
			if host == "" || s.Port == 0 {
				continue
			}
			hostports = append(hostports, net.JoinHostPort(host, strconv.Itoa(int(s.Port))))
		}
	} else {
		addrs, err := r.LookupHost(ctx, d.Name)
		if err != nil {
			if !isNotFound(err) {
				return nil, err
			}
			addrs = nil
		}
		for _, a := range addrs {
			hostports = append(hostports, net.JoinHostPort(a, strconv.Itoa(d.Port)))
		}
	}
	slices.Sort(hostports)
	hostports = slices.Compact(hostports)
	out := make([]Backend, 0, len(hostports))
	for _, hp := range hostports {
		out = append(out, Backend{ID: hp, URL: d.Scheme + "://" + hp, Zone: d.Zone, Weight: d.Weight, Source: SourceDNS})
	}
	return out, nil
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// discoveryLoop polls DNS (or the Finder) while this node leads.
func (c *Agreement) discoveryLoop(ctx context.Context) {
	d := &c.cfg.Discovery
	missing := map[string]int{} // DNS backend -> consecutive polls without it
	tick := time.NewTicker(d.Interval)
	defer tick.Stop()
	for {
		c.discover(ctx, d, missing)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// removeAfter is how many consecutive polls must miss a discovered backend
// before it is removed.
const removeAfter = 2

func (c *Agreement) discover(ctx context.Context, d *DiscoveryConfig, missing map[string]int) {
	found, err := d.lookup(ctx)
	if err != nil {
		c.met.discoveryPolls.WithLabelValues("error").Inc()
		c.log.Warn("discovery lookup failed", "name", d.Name, "err", err)
		return
	}
	c.met.discoveryPolls.WithLabelValues("ok").Inc()
	want := syncedDiscovered(c.fsm.load().state.Backends, found, missing)
	if want == nil {
		return
	}
	if _, err := c.write(ctx, Command{Op: OpSyncDiscovered, Backends: want}); err != nil {
		c.log.Warn("discovery commit failed", "err", err)
		return
	}
	c.log.Info("discovered backends committed", "name", d.Name, "backends", len(want))
}

// syncedDiscovered returns the DNS-sourced backend set to commit given the
// current backends and a lookup's result, or nil when nothing changes.
// missing counts consecutive polls that lacked each current DNS backend; a
// backend stays until removeAfter polls missed it.
func syncedDiscovered(cur, found []Backend, missing map[string]int) []Backend {
	inFound := map[string]bool{}
	for _, b := range found {
		inFound[b.ID] = true
		delete(missing, b.ID)
	}
	want := slices.Clone(found)
	changed := false
	curDNS := map[string]bool{}
	for _, b := range cur {
		if b.Source != SourceDNS {
			continue
		}
		curDNS[b.ID] = true
		if inFound[b.ID] {
			continue
		}
		missing[b.ID]++
		if missing[b.ID] < removeAfter {
			b.State, b.StateBy = "", ""
			want = append(want, b)
		} else {
			delete(missing, b.ID)
			changed = true
		}
	}
	for id := range missing {
		if !curDNS[id] {
			delete(missing, id)
		}
	}
	byID := map[string]Backend{}
	for _, b := range cur {
		byID[b.ID] = b
	}
	for _, b := range found {
		old, ok := byID[b.ID]
		switch {
		case !ok:
			changed = true
		case old.Source != SourceDNS:
			// an operator's backend with the same ID wins; nothing to do
		case old.URL != b.URL || old.Zone != b.Zone || old.Weight != b.Weight:
			changed = true
		}
	}
	if !changed {
		return nil
	}
	slices.SortFunc(want, func(a, b Backend) int { return strings.Compare(a.ID, b.ID) })
	return want
}
