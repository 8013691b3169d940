package chaos

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// Run starts the target, puts it under load, runs the configured faults one
// after the other and reports what each did. Everything the target and
// the engine started is stopped before Run returns. A cancelled ctx ends
// the run early: the faults done so far are reported with ErrInterrupted.
func Run(ctx context.Context, cfg Config, tgt Target) (Report, error) {
	rep := Report{Target: tgt.Name(), Rate: cfg.Rate, Workload: string(cfg.Workload.Kind)}
	if err := cfg.Validate(); err != nil {
		return rep, err
	}
	defer tgt.Close()
	e := &engine{cfg: cfg, tgt: tgt}
	e.logf0("starting the %s target", tgt.Name())
	if err := tgt.Start(ctx); err != nil {
		return rep, err
	}
	e.admin = newAdminClient(tgt.Admin(), 8)
	defer e.admin.close()
	rep.Describe = tgt.Describe()
	e.routers = tgt.Routers()
	e.backends = tgt.Backends()
	if err := e.waitCluster(ctx); err != nil {
		return rep, err
	}
	wc := cfg.Workload
	if wc.Model == "" {
		ids, err := loadtest.Models(ctx, e.routers[0].URL)
		if err != nil {
			return rep, err
		}
		if len(ids) == 0 {
			return rep, fmt.Errorf("%w: %s/v1/models lists no model", ErrNotReady, e.routers[0].URL)
		}
		wc.Model = ids[0]
	}
	wc.Seed = cfg.Seed
	gen, err := workload.New(wc)
	if err != nil {
		return rep, err
	}

	e.t0 = time.Now()
	e.rot = newRotation(e.routers)
	e.load = newLoader(&e.cfg, gen, e.rot, e.t0)
	e.probe = newProber(&e.cfg, e.routers, probePrompts(cfg.ProbePrompts, wc.Model, cfg.Seed), tgt.Admin(), e.t0)
	e.kv = newKVScraper(&e.cfg, e.backends, e.t0)
	loadCtx, stopLoad := context.WithCancel(context.Background())
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); e.load.Run(loadCtx) }()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); e.probe.Run(sampleCtx) }()
	go func() { defer wg.Done(); e.kv.Run(sampleCtx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		// requests in flight finish (each bounded by its timeout) while
		// the samplers still run; then the samplers stop
		stopLoad()
		<-loadDone
		stopSampling()
		wg.Wait()
	}
	defer stop()

	e.logf("load: %s workload, %g requests/s over %d routers; warming up %s", wc.Kind, cfg.Rate, len(e.routers), cfg.Warmup)
	runErr := sleep(ctx, cfg.Warmup)
	var results []Result
	for i, f := range cfg.Faults {
		if runErr != nil {
			break
		}
		var next Fault
		if i+1 < len(cfg.Faults) {
			next = cfg.Faults[i+1]
		}
		res := e.runFault(ctx, f, next)
		results = append(results, res)
		if ctx.Err() != nil {
			runErr = ErrInterrupted
			break
		}
		if err := e.restore(ctx, next); err != nil {
			runErr = fmt.Errorf("restoring the cluster after %s: %w", f, err)
			break
		}
	}
	if runErr != nil && ctx.Err() != nil {
		runErr = ErrInterrupted
	}
	e.logf("stopping the load")
	stop()
	rep.Duration = time.Since(e.t0)
	recs := e.load.records()
	ticks := e.probe.Ticks()
	points := e.kv.Points()
	rep.Requests = len(recs)
	rep.Ticks = len(ticks)
	rep.ProbeResolution = medianGap(ticks)
	for i := range results {
		e.finish(&results[i], recs, ticks, points)
	}
	rep.Results = results
	return rep, runErr
}

// engine is one run's state.
type engine struct {
	cfg      Config
	tgt      Target
	admin    *adminClient
	t0       time.Time
	routers  []Router
	backends []Backend // as at the start (the full fleet)
	rot      *rotation
	load     *loader
	probe    *prober
	kv       *kvScraper

	// removed is the backend backend-remove took out, until it is added back.
	removed *Backend
}

func (e *engine) since() time.Duration { return time.Since(e.t0) }

func (e *engine) logf0(format string, a ...any) {
	if e.cfg.Log != nil {
		fmt.Fprintf(e.cfg.Log, "chaos: "+format+"\n", a...)
	}
}

func (e *engine) logf(format string, a ...any) {
	if e.cfg.Log != nil {
		fmt.Fprintf(e.cfg.Log, "chaos [%6.1fs] %s\n", e.since().Seconds(), fmt.Sprintf(format, a...))
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// poll calls cond every interval until it returns true, ctx ends or
// timeout passes.
func poll(ctx context.Context, timeout, interval time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		if err := sleep(ctx, interval); err != nil {
			return err
		}
	}
}

// cluster asks one router for its view of the cluster.
func (e *engine) cluster(ctx context.Context, r Router) (clusterView, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var v clusterView
	err := e.admin.do(ctx, http.MethodGet, r.AdminURL+"/v1/cluster", nil, &v)
	return v, err
}

// leader returns the leader every answering router among rs names, "" when
// they do not agree or none answers.
func (e *engine) leader(ctx context.Context, rs []Router) (string, uint64) {
	leader, epoch, n := "", uint64(0), 0
	for _, r := range rs {
		v, err := e.cluster(ctx, r)
		if err != nil {
			continue
		}
		l := v.leader()
		if l == "" || (n > 0 && (l != leader || v.Epoch != epoch)) {
			return "", 0
		}
		leader, epoch = l, v.Epoch
		n++
	}
	if n < len(rs) {
		return "", 0
	}
	return leader, epoch
}

// waitCluster waits until every router is ready and they agree on a leader
// and a non-zero epoch.
func (e *engine) waitCluster(ctx context.Context) error {
	start := time.Now()
	var leader string
	var epoch uint64
	err := poll(ctx, e.cfg.ReadyTimeout, 200*time.Millisecond, func() bool {
		for _, r := range e.routers {
			if !e.ready(ctx, r) {
				return false
			}
		}
		leader, epoch = e.leader(ctx, e.routers)
		return leader != "" && epoch > 0
	})
	if err != nil {
		if ctx.Err() != nil {
			return ErrInterrupted
		}
		return fmt.Errorf("%w: no agreed leader and epoch across %d routers within %s", ErrNotReady, len(e.routers), e.cfg.ReadyTimeout)
	}
	e.logf0("cluster ready in %.1fs: leader %s, epoch %d", time.Since(start).Seconds(), leader, epoch)
	return nil
}

// ready reports whether a router answers GET /readyz with 200.
func (e *engine) ready(ctx context.Context, r Router) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := e.admin.hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady waits for a router to be ready and returns when it was seen so.
func (e *engine) waitReady(ctx context.Context, r Router) (time.Duration, error) {
	err := poll(ctx, e.cfg.ReadyTimeout, 50*time.Millisecond, func() bool { return e.ready(ctx, r) })
	if err != nil {
		return 0, fmt.Errorf("%w: %s not ready within %s", ErrNotReady, r.Name, e.cfg.ReadyTimeout)
	}
	return e.since(), nil
}

// router returns the router named name.
func (e *engine) router(name string) Router {
	for _, r := range e.routers {
		if r.Name == name {
			return r
		}
	}
	return Router{Name: name}
}

// others returns the routers other than those named.
func (e *engine) others(names ...string) []Router {
	var out []Router
	for _, r := range e.routers {
		skip := false
		for _, n := range names {
			skip = skip || r.Name == n
		}
		if !skip {
			out = append(out, r)
		}
	}
	return out
}

// backendState returns the agreed state of backend id as router r sees it
// ("" when it is not in the cluster).
func (e *engine) backendState(ctx context.Context, r Router, id string) (string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var v struct {
		Epoch    uint64 `json:"epoch"`
		Backends []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"backends"`
	}
	if err := e.admin.do(ctx, http.MethodGet, r.AdminURL+"/v1/backends", nil, &v); err != nil {
		return "", 0, err
	}
	for _, b := range v.Backends {
		if b.ID == id {
			return b.State, v.Epoch, nil
		}
	}
	return "", v.Epoch, nil
}

// health returns whether router r's proxy counts backend id as healthy
// (agreed active and passing its own checks) and the agreed state; found
// is false when r does not know the backend.
func (e *engine) health(ctx context.Context, r Router, id string) (healthy bool, state string, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var v struct {
		Backends []struct {
			ID      string `json:"id"`
			State   string `json:"state"`
			Healthy bool   `json:"healthy"`
		} `json:"backends"`
	}
	if err := e.admin.do(ctx, http.MethodGet, r.AdminURL+"/status", nil, &v); err != nil {
		return false, "", false, err
	}
	for _, b := range v.Backends {
		if b.ID == id {
			return b.Healthy, b.State, true, nil
		}
	}
	return false, "", false, nil
}

// waitHealth polls every router until each one counts backend id as
// healthy (want) or not, and returns when that was first seen and the
// agreed states the routers reported then.
func (e *engine) waitHealth(ctx context.Context, id string, want bool) (time.Duration, error) {
	err := poll(ctx, e.cfg.ReadyTimeout, 100*time.Millisecond, func() bool {
		for _, r := range e.routers {
			h, _, found, err := e.health(ctx, r, id)
			if err != nil || !found || h != want {
				return false
			}
		}
		return true
	})
	if err != nil {
		word := "healthy"
		if !want {
			word = "unhealthy"
		}
		return 0, fmt.Errorf("%w: not every router saw backend %s %s within %s", ErrNotReady, id, word, e.cfg.ReadyTimeout)
	}
	return e.since(), nil
}

// writeAck is an admin write's answer.
type writeAck struct {
	Epoch uint64 `json:"epoch"`
	Node  string `json:"node"`
}

// removeBackend deletes a backend through router r's admin API.
func (e *engine) removeBackend(ctx context.Context, r Router, id string) (writeAck, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var ack writeAck
	err := e.admin.do(ctx, http.MethodDelete, r.AdminURL+"/v1/backends/"+id, nil, &ack)
	return ack, err
}

// addBackend adds b through router r's admin API.
func (e *engine) addBackend(ctx context.Context, r Router, b Backend) (writeAck, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"id":%q,"url":%q,"zone":%q}`, b.ID, b.URL, b.Zone)
	var ack writeAck
	err := e.admin.do(ctx, http.MethodPost, r.AdminURL+"/v1/backends", []byte(body), &ack)
	return ack, err
}

// resetCache empties a gpusim backend's prefix cache (POST
// /reset_prefix_cache next to its metrics).
func (e *engine) resetCache(ctx context.Context, b Backend) error {
	for _, cur := range e.tgt.Backends() {
		if cur.ID == b.ID {
			b = cur
		}
	}
	base, ok := strings.CutSuffix(b.MetricsURL, "/metrics")
	if !ok {
		return fmt.Errorf("no metrics URL for %s", b.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return e.admin.do(ctx, http.MethodPost, base+"/reset_prefix_cache", nil, nil)
}

// stable waits until agreement has been 100% with every router answering
// for StableFor, at most timeout.
func (e *engine) stable(ctx context.Context, timeout time.Duration) error {
	from := e.since()
	return poll(ctx, timeout, e.cfg.ProbeInterval, func() bool {
		ticks := ticksFrom(e.probe.Ticks(), from)
		return StableSince(ticks, Owners, len(e.routers)) >= e.cfg.StableFor
	})
}

// ticksFrom returns the ticks at or after from.
func ticksFrom(ticks []Tick, from time.Duration) []Tick {
	i := sort.Search(len(ticks), func(i int) bool { return ticks[i].At >= from })
	return ticks[i:]
}

// restore brings the cluster back to its starting shape between faults:
// every router up and in rotation, every backend in the cluster and
// active (a backend removed on purpose stays out when next is backend-add),
// and agreement stable.
func (e *engine) restore(ctx context.Context, next Fault) error {
	for _, r := range e.routers {
		if !e.ready(ctx, r) {
			e.logf("restore: starting %s", r.Name)
			_ = e.tgt.ResumeRouter(ctx, r.Name)
			_ = e.tgt.HealRouter(ctx, r.Name)
			if !e.ready(ctx, r) {
				if err := e.tgt.StartRouter(ctx, r.Name); err != nil {
					return err
				}
			}
			if _, err := e.waitReady(ctx, r); err != nil {
				return err
			}
		}
		e.rot.set(r.Name, true)
	}
	if e.removed != nil && next != BackendAdd {
		b := *e.removed
		e.logf("restore: adding %s back", b.ID)
		if _, err := e.addBackend(ctx, e.routers[0], b); err != nil {
			return err
		}
		e.removed = nil
	}
	for _, b := range e.backends {
		if e.removed != nil && b.ID == e.removed.ID {
			continue
		}
		if _, err := e.waitHealth(ctx, b.ID, true); err != nil {
			return err
		}
	}
	if err := e.stable(ctx, e.cfg.ReadyTimeout); err != nil {
		return fmt.Errorf("%w: agreement not stable at 100%% within %s", ErrNotReady, e.cfg.ReadyTimeout)
	}
	return nil
}

// medianGap is the median time between consecutive ticks.
func medianGap(ticks []Tick) time.Duration {
	if len(ticks) < 2 {
		return 0
	}
	gaps := make([]time.Duration, 0, len(ticks)-1)
	for i := 1; i < len(ticks); i++ {
		gaps = append(gaps, ticks[i].At-ticks[i-1].At)
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	return gaps[len(gaps)/2]
}

// finish computes a fault's figures from the whole run's samples.
func (e *engine) finish(res *Result, recs []Record, ticks []Tick, points []KVPoint) {
	if res.Skipped != "" {
		return
	}
	sort.SliceStable(res.Events, func(i, j int) bool { return res.Events[i].At < res.Events[j].At })
	var window []Record
	for _, r := range recs {
		if r.Start >= res.Start && r.Start <= res.End {
			window = append(window, r)
		}
	}
	res.Errors = Classify(window, res.victims, res.Outages)
	res.AgreementMin, res.AgreementSeen = MinAgreement(ticks, Picks, res.Inject, res.End)
	res.OwnerAgreementMin, _ = MinAgreement(ticks, Owners, res.Inject, res.End)
	for i := range res.Settles {
		s := &res.Settles[i]
		until := s.Until
		if until == 0 {
			until = res.End
		}
		s.Delay, s.OK = Reconverge(ticks, Picks, s.At, until)
		s.OwnerDelay, s.OwnerOK = Reconverge(ticks, Owners, s.At, until)
		// the first disagreement sample after the settle, if any
		for _, t := range ticksFrom(ticks, s.At) {
			if t.At > until {
				break
			}
			if t.Sample != "" {
				s.Sample = fmt.Sprintf("%.2fs after: %s", (t.At - s.At).Seconds(), t.Sample)
				break
			}
		}
	}
	res.KV = HitDip(points, res.Start, res.Inject, res.End, e.cfg.KVWindow, e.cfg.KVInterval, e.cfg.KVTolerance)
	if res.Fault == BackendRemove && res.RemovalEpoch > 0 {
		res.LateByEpoch, res.LateByTime = LateRouted(window, res.Victim, res.RemovalEpoch, res.removalAck)
	}
}

// joinNames lists router names.
func joinNames(rs []Router) string {
	var n []string
	for _, r := range rs {
		n = append(n, r.Name)
	}
	return strings.Join(n, ",")
}
