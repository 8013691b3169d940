package compare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/agree"
	"github.com/warmroute/warmroute/loadtest/fleet"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// ErrBadPlan wraps an invalid Plan.
var ErrBadPlan = errors.New("compare: invalid plan")

// Direct labels the runs of a fleet without routers.
const Direct = "DIRECT"

// Case is one workload and the load to offer with it.
type Case struct {
	// Name labels the workload in the report ("rag", "chat", ...).
	Name     string
	Workload workload.Config
	// Load is the arrival model and duration; Targets, MetricsURLs,
	// Backends, Label and Workload are filled for each run.
	Load loadtest.Config
	// Generator, when set, makes the requests instead of Workload (a trace
	// replay, say), given the model the fleet serves.
	Generator func(model string) (workload.Generator, error)
}

// Plan is a comparison: every case under every strategy.
type Plan struct {
	Cases      []Case
	Strategies []string
	// Fleet is started afresh for every run with Strategy replaced.
	Fleet fleet.Config
	// Progress receives status lines (nil: silent).
	Progress io.Writer
	// OnResult, when set, is called after every run (for incremental
	// output).
	OnResult func(stats.Summary)
	// Agreement, with more than one router, asks every router where the
	// workload's first agreementRequests requests would go, all at once
	// every second from the end of the warm-up to the end of the run
	// (loadtest/agree), and puts the counts in the run's Summary.
	Agreement bool
}

// agreementRequests is how many of a workload's first requests the
// agreement probe asks about.
const agreementRequests = 16

// Validate reports the first problem with p.
func (p Plan) Validate() error {
	if len(p.Cases) == 0 {
		return fmt.Errorf("%w: no workloads", ErrBadPlan)
	}
	if p.Fleet.Routers > 0 && len(p.Strategies) == 0 {
		return fmt.Errorf("%w: no strategies", ErrBadPlan)
	}
	for _, s := range p.Strategies {
		f := p.Fleet
		f.Strategy = s
		if err := f.Validate(); err != nil {
			return err
		}
	}
	for _, c := range p.Cases {
		if c.Generator != nil {
			continue
		}
		w := c.Workload
		if w.Model == "" {
			w.Model = "placeholder" // resolved from the fleet
		}
		if err := w.Validate(); err != nil {
			return fmt.Errorf("workload %s: %w", c.Name, err)
		}
	}
	return nil
}

func (p *Plan) logf(format string, a ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, format+"\n", a...)
	}
}

// Execute runs the plan. When ctx is cancelled it stops the current run,
// stops its fleet and returns the runs so far (the last one partial) with an
// error wrapping loadtest.ErrInterrupted. Any other error ends the
// comparison with the runs completed before it.
func Execute(ctx context.Context, p Plan) ([]stats.Summary, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	strategies := p.Strategies
	if p.Fleet.Routers == 0 {
		strategies = []string{Direct}
	}
	var out []stats.Summary
	for _, c := range p.Cases {
		for _, s := range strategies {
			sum, err := p.one(ctx, c, s)
			if err != nil && !errors.Is(err, loadtest.ErrInterrupted) {
				return out, fmt.Errorf("%s under %s: %w", c.Name, s, err)
			}
			if sum != nil {
				out = append(out, *sum)
				if p.OnResult != nil {
					p.OnResult(*sum)
				}
			}
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// one runs case c under strategy s against a fresh fleet.
func (p *Plan) one(ctx context.Context, c Case, s string) (*stats.Summary, error) {
	fc := p.Fleet
	if s != Direct {
		fc.Strategy = s
	}
	p.logf("%s / %s: starting a cold fleet (%d instances, %d router(s))", c.Name, s, fc.Instances, fc.Routers)
	t0 := time.Now()
	f, err := fleet.Start(ctx, fc)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w while starting the fleet", loadtest.ErrInterrupted)
		}
		return nil, err
	}
	defer func() {
		if err := f.Close(); err != nil {
			p.logf("%s / %s: stopping the fleet: %v", c.Name, s, err)
		}
	}()
	w := c.Workload
	if w.Model == "" {
		ids, err := loadtest.Models(ctx, f.Targets()[0])
		if err != nil || len(ids) == 0 {
			return nil, fmt.Errorf("finding the served model: %v", err)
		}
		w.Model = ids[0]
	}
	newGen := func() (workload.Generator, error) {
		if c.Generator != nil {
			return c.Generator(w.Model)
		}
		return workload.New(w)
	}
	gen, err := newGen()
	if err != nil {
		return nil, err
	}
	lc := c.Load
	lc.Targets = f.Targets()
	lc.MetricsURLs = f.MetricsURLs()
	for _, rt := range f.Routers() {
		lc.RouterMetricsURLs = append(lc.RouterMetricsURLs, rt.AdminURL+"/metrics")
	}
	lc.Backends = f.BackendIDs()
	lc.Label = s
	lc.Workload = c.Name
	p.logf("%s / %s: fleet ready in %.1fs, running %s", c.Name, s, time.Since(t0).Seconds(), describeLoad(lc))
	var probe func() *stats.Agreement
	if p.Agreement && len(f.Routers()) > 1 {
		if probe, err = p.startAgreement(ctx, f.Routers(), newGen, lc.Warmup); err != nil {
			return nil, err
		}
	}
	sum, err := loadtest.Run(ctx, lc, gen)
	if probe != nil {
		sum.Agreement = probe()
	}
	if err != nil && !errors.Is(err, loadtest.ErrInterrupted) {
		return nil, err
	}
	return &sum, err
}

// startAgreement starts asking the routers about the first requests of a
// generator newGen makes, once warmup has passed; the function it returns
// stops it and returns the counts (nil when the window never began).
func (p *Plan) startAgreement(ctx context.Context, routers []fleet.Router, newGen func() (workload.Generator, error), warmup time.Duration) (func() *stats.Agreement, error) {
	gen, err := newGen()
	if err != nil {
		return nil, err
	}
	cfg := agree.Config{Requests: make([]agree.Request, agreementRequests)}
	for i := range cfg.Requests {
		var r workload.Request
		gen.Next(&r)
		cfg.Requests[i] = agree.Request{Path: r.Path, Body: r.Body}
	}
	for i, r := range routers {
		cfg.Routers = append(cfg.Routers, agree.Router{Name: fmt.Sprintf("router-%d", i), AdminURL: r.AdminURL})
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan *stats.Agreement, 1)
	go func() {
		select {
		case <-pctx.Done():
			done <- nil
			return
		case <-time.After(warmup):
		}
		a := agree.Run(pctx, cfg)
		done <- &a
	}()
	return func() *stats.Agreement {
		cancel()
		return <-done
	}, nil
}

func describeLoad(c loadtest.Config) string {
	var d string
	if c.Mode == loadtest.ClosedLoop {
		d = fmt.Sprintf("closed loop, %d concurrent", c.Concurrency)
	} else {
		d = fmt.Sprintf("open loop, %.1f req/s", c.Rate)
	}
	if c.Duration > 0 {
		d += fmt.Sprintf(" for %s", c.Duration)
	}
	if c.Requests > 0 {
		d += fmt.Sprintf(", at most %d requests", c.Requests)
	}
	return d
}
