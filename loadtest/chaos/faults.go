package chaos

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// faultRun is the bookkeeping of one fault while it runs.
type faultRun struct {
	e      *engine
	res    *Result
	snapAt Router // the router snapshots are taken from (never the victim)
	before []string
}

func (fr *faultRun) event(format string, a ...any) { fr.eventAt(fr.e.since(), format, a...) }

// eventAt records an event that happened at at.
func (fr *faultRun) eventAt(at time.Duration, format string, a ...any) {
	ev := Event{At: at, What: fmt.Sprintf(format, a...)}
	fr.res.Events = append(fr.res.Events, ev)
	fr.e.logf("%s: %s", fr.res.Fault, ev.What)
}

func (fr *faultRun) settle(what string, at time.Duration) {
	fr.res.Settles = append(fr.res.Settles, Settle{What: what, At: at})
}

// detected records a physical event whose detection is measured but not
// held to the reconvergence bound.
func (fr *faultRun) detected(what string, at time.Duration) {
	fr.res.Settles = append(fr.res.Settles, Settle{What: what, At: at, Detection: true})
}

// watchBackend polls every router's view of backend id until each counts
// it healthy (up) or not, and the agreed state (on every router) is
// active (up) or down; the agreed state is waited for at most
// ReadyTimeout, and its absence is only noted. It records both moments.
func (fr *faultRun) watchBackend(ctx context.Context, id string, up bool, since time.Duration) error {
	e := fr.e
	want := "down"
	if up {
		want = "active"
	}
	var allAt, commitAt time.Duration
	err := poll(ctx, e.cfg.ReadyTimeout, 100*time.Millisecond, func() bool {
		all, committed := true, true
		for _, r := range e.routers {
			h, st, found, err := e.health(ctx, r, id)
			if err != nil || !found {
				all, committed = false, false
				break
			}
			all = all && h == up
			committed = committed && st == want
		}
		now := e.since()
		if all && allAt == 0 {
			allAt = now
		}
		if committed && commitAt == 0 {
			commitAt = now
		}
		return allAt > 0 && commitAt > 0
	})
	word := map[bool]string{true: "healthy", false: "unhealthy"}[up]
	if allAt == 0 {
		if err == nil {
			err = context.DeadlineExceeded
		}
		return fmt.Errorf("%w: not every router counted backend %s %s within %s", ErrNotReady, id, word, e.cfg.ReadyTimeout)
	}
	fr.eventAt(allAt, "every router counts %s %s, %.2fs after the %s", id, word, (allAt - since).Seconds(), map[bool]string{true: "restart", false: "kill"}[up])
	if commitAt == 0 {
		fr.note("%s not committed %s within %s", id, want, e.cfg.ReadyTimeout)
		return nil
	}
	_, epoch, _ := e.backendState(ctx, fr.snapAt, id)
	fr.eventAt(commitAt, "every router has %s %s (agreed, epoch %d), %.2fs after the %s", id, want, epoch, (commitAt - since).Seconds(), map[bool]string{true: "restart", false: "kill"}[up])
	fr.settle(id+" "+want+" committed", commitAt)
	return nil
}

// step marks the start of the fault's next action: agreement after the
// settles so far is looked for up to here.
func (fr *faultRun) step() {
	now := fr.e.since()
	for i := range fr.res.Settles {
		if fr.res.Settles[i].Until == 0 {
			fr.res.Settles[i].Until = now
		}
	}
}

func (fr *faultRun) note(format string, a ...any) {
	n := fmt.Sprintf(format, a...)
	fr.res.Notes = append(fr.res.Notes, n)
	fr.e.logf("%s: note: %s", fr.res.Fault, n)
}

// snapshot takes the owners of every probe prompt from fr.snapAt; nil
// (with a note) when that failed.
func (fr *faultRun) snapshot(ctx context.Context, what string) []string {
	s, _, err := fr.e.probe.snapshot(ctx, fr.snapAt)
	if err != nil {
		fr.note("%s snapshot: %v", what, err)
		return nil
	}
	return s
}

// moved compares the before snapshot with s.
func (fr *faultRun) moved(s []string, backend string) *Movement {
	if fr.before == nil || s == nil {
		return nil
	}
	m := Move(fr.before, s, backend)
	return &m
}

// observe waits after the last settle: at least MinObserve, until
// agreement has been 100% for StableFor with every router answering and
// the hit rate is back, at most MaxObserve.
func (fr *faultRun) observe(ctx context.Context) {
	e := fr.e
	var last time.Duration
	for _, s := range fr.res.Settles {
		last = max(last, s.At)
	}
	minEnd, maxEnd := last+e.cfg.MinObserve, last+e.cfg.MaxObserve
	var stableOK, kvOK bool
	err := poll(ctx, maxEnd-e.since(), e.cfg.ProbeInterval, func() bool {
		now := e.since()
		ticks := ticksFrom(e.probe.Ticks(), last)
		stableOK = StableSince(ticks, Picks, len(e.routers)) >= e.cfg.StableFor
		d := HitDip(e.kv.Points(), fr.res.Start, fr.res.Inject, now, e.cfg.KVWindow, e.cfg.KVInterval, e.cfg.KVTolerance)
		kvOK = !d.Measured || d.RecoveredOK
		return now >= minEnd && stableOK && kvOK
	})
	if err != nil && ctx.Err() == nil {
		fr.note("observation stopped after %s: agreement stable %v, hit rate back %v", e.cfg.MaxObserve, stableOK, kvOK)
	}
	fr.res.End = e.since()
}

// roles returns the current leader and the followers sorted by name.
func (e *engine) roles(ctx context.Context) (string, []Router, error) {
	var leader string
	err := poll(ctx, e.cfg.ReadyTimeout, 200*time.Millisecond, func() bool {
		leader, _ = e.leader(ctx, e.routers)
		return leader != ""
	})
	if err != nil {
		return "", nil, fmt.Errorf("%w: no agreed leader", ErrNotReady)
	}
	f := e.others(leader)
	sort.Slice(f, func(i, j int) bool { return f[i].Name < f[j].Name })
	return leader, f, nil
}

// runFault runs one fault: a pre-fault window, the fault, observation.
func (e *engine) runFault(ctx context.Context, f Fault, next Fault) Result {
	res := Result{Fault: f, Backends: len(e.backends)}
	if f == RestartAll {
		for _, r := range e.routers {
			res.victims = append(res.victims, r.Name)
		}
	}
	if e.removed != nil {
		res.Backends--
	}
	fr := &faultRun{e: e, res: &res}
	fail := func(err error) Result {
		res.Failed = err.Error()
		res.End = e.since()
		e.logf("%s: FAILED: %v", f, err)
		return res
	}
	leader, followers, err := e.roles(ctx)
	if err != nil {
		return fail(err)
	}
	fr.snapAt = e.routers[0]
	var victimRouter Router
	var victimBackend Backend
	switch f {
	case RouterKill, RouterPartition:
		victimRouter = followers[0]
	case RouterPause:
		victimRouter = followers[len(followers)-1]
	case LeaderKill:
		victimRouter = e.router(leader)
	case BackendKill:
		victimBackend = e.backends[min(1, len(e.backends)-1)]
	case BackendRemove, BackendAdd:
		victimBackend = e.backends[len(e.backends)-1]
	}
	if victimRouter.Name != "" {
		res.Victim = victimRouter.Name
		res.victims = []string{victimRouter.Name}
		fr.snapAt = e.others(victimRouter.Name)[0]
	}
	if victimBackend.ID != "" {
		res.Victim = victimBackend.ID
		fr.snapAt = followers[0]
	}
	if f == RouterPartition {
		if err := e.tgt.CanPartition(); err != nil {
			res.Skipped = err.Error()
			e.logf("%s: skipped: %v", f, err)
			return res
		}
	}
	if f == BackendAdd && e.removed == nil {
		// set-up: take the backend out first, untimed, and let the fleet
		// settle and warm up without it
		e.logf("%s: set-up: removing %s first", f, victimBackend.ID)
		if _, err := e.removeBackend(ctx, followers[0], victimBackend.ID); err != nil {
			return fail(err)
		}
		e.removed = &victimBackend
		_ = e.stable(ctx, e.cfg.ReadyTimeout)
		if err := sleep(ctx, e.cfg.Pre); err != nil {
			return fail(err)
		}
	}
	if f == BackendAdd {
		res.Backends = len(e.backends) - 1
	}

	res.Start = e.since()
	e.logf("%s: pre-fault window (%s), victim %s", f, e.cfg.Pre, res.Victim)
	fr.before = fr.snapshot(ctx, "pre-fault")
	if err := sleep(ctx, res.Start+e.cfg.Pre-e.since()); err != nil {
		return fail(err)
	}
	res.Inject = e.since()
	switch f {
	case RouterKill, LeaderKill:
		err = fr.routerKill(ctx, victimRouter, f == LeaderKill)
	case RouterPause:
		err = fr.routerPause(ctx, victimRouter)
	case RouterPartition:
		err = fr.routerPartition(ctx, victimRouter)
	case BackendKill:
		err = fr.backendKill(ctx, victimBackend)
	case BackendRemove:
		err = fr.backendRemove(ctx, victimBackend, followers[len(followers)-1])
	case BackendAdd:
		err = fr.backendAdd(ctx, victimBackend, followers[len(followers)-1])
	case RestartAll:
		err = fr.restartAll(ctx)
	}
	if err != nil {
		return fail(err)
	}
	if res.End == 0 {
		res.End = e.since()
	}
	return res
}

// holdWithSnapshot waits out the fault's hold from inject, taking the
// "during" snapshot half way.
func (fr *faultRun) holdWithSnapshot(ctx context.Context, backend string) error {
	e := fr.e
	if err := sleep(ctx, fr.res.Inject+e.cfg.Hold/2-e.since()); err != nil {
		return err
	}
	fr.res.Moved = fr.moved(fr.snapshot(ctx, "during-fault"), backend)
	return sleep(ctx, fr.res.Inject+e.cfg.Hold-e.since())
}

func (fr *faultRun) routerKill(ctx context.Context, v Router, leader bool) error {
	e := fr.e
	e.rot.set(v.Name, false)
	from := e.since()
	err := e.tgt.KillRouter(ctx, v.Name)
	fr.res.Outages = append(fr.res.Outages, Outage{Router: v.Name, From: from, To: e.since()})
	if err != nil {
		return err
	}
	fr.event("killed %s", v.Name)
	if leader {
		survivors := e.others(v.Name)
		var nl string
		err := poll(ctx, e.cfg.ReadyTimeout, 50*time.Millisecond, func() bool {
			nl, _ = e.leader(ctx, survivors)
			return nl != "" && nl != v.Name
		})
		if err != nil {
			fr.note("no new leader within %s", e.cfg.ReadyTimeout)
		} else {
			at := e.since()
			fr.res.Failover, fr.res.NewLeader = at-from, nl
			fr.event("new leader %s after %.2fs", nl, fr.res.Failover.Seconds())
			fr.settle("new leader", at)
		}
	}
	if err := fr.holdWithSnapshot(ctx, ""); err != nil {
		return err
	}
	fr.step()
	if err := e.tgt.StartRouter(ctx, v.Name); err != nil {
		return err
	}
	fr.event("started %s again", v.Name)
	at, err := e.waitReady(ctx, v)
	if err != nil {
		return err
	}
	e.rot.set(v.Name, true)
	fr.event("%s ready", v.Name)
	fr.settle(v.Name+" back", at)
	fr.observe(ctx)
	fr.res.Returned = fr.moved(fr.snapshot(ctx, "after"), "")
	return nil
}

func (fr *faultRun) routerPause(ctx context.Context, v Router) error {
	e := fr.e
	if err := e.tgt.PauseRouter(ctx, v.Name); err != nil {
		return err
	}
	fr.event("paused %s", v.Name)
	herr := fr.holdWithSnapshot(ctx, "")
	// resume whatever happened: a router must not stay stopped
	if err := e.tgt.ResumeRouter(context.WithoutCancel(ctx), v.Name); err != nil {
		return err
	}
	if herr != nil {
		return herr
	}
	fr.event("resumed %s", v.Name)
	fr.settle(v.Name+" resumed", e.since())
	fr.observe(ctx)
	fr.res.Returned = fr.moved(fr.snapshot(ctx, "after"), "")
	return nil
}

func (fr *faultRun) routerPartition(ctx context.Context, v Router) error {
	e := fr.e
	if err := e.tgt.PartitionRouter(ctx, v.Name); err != nil {
		return err
	}
	fr.event("partitioned %s from %s", v.Name, joinNames(e.others(v.Name)))
	herr := fr.holdWithSnapshot(ctx, "")
	if err := e.tgt.HealRouter(context.WithoutCancel(ctx), v.Name); err != nil {
		return err
	}
	if herr != nil {
		return herr
	}
	fr.event("healed %s", v.Name)
	fr.settle(v.Name+" healed", e.since())
	fr.observe(ctx)
	fr.res.Returned = fr.moved(fr.snapshot(ctx, "after"), "")
	return nil
}

func (fr *faultRun) backendKill(ctx context.Context, b Backend) (err error) {
	e := fr.e
	from := e.since()
	err = e.tgt.KillBackend(ctx, b.ID)
	fr.res.Outages = append(fr.res.Outages, Outage{Backend: b.ID, From: from, To: e.since()})
	if err != nil {
		return err
	}
	fr.event("killed %s", b.ID)
	down := true
	defer func() {
		// a backend must not stay dead after a failure part way
		if down && ctx.Err() == nil {
			if rerr := e.tgt.StartBackend(ctx, b.ID); rerr != nil && err == nil {
				err = rerr
			}
			e.kv.setTargets(e.tgt.Backends())
		}
	}()
	fr.detected(b.ID+" killed", from)
	if err := fr.watchBackend(ctx, b.ID, false, from); err != nil {
		return err
	}
	if err := e.stable(ctx, e.cfg.MaxObserve); err != nil {
		fr.note("agreement not stable while %s was down", b.ID)
	}
	fr.res.Moved = fr.moved(fr.snapshot(ctx, "while down"), b.ID)
	if err := sleep(ctx, fr.res.Inject+e.cfg.Hold-e.since()); err != nil {
		return err
	}
	fr.step()
	if err := e.tgt.StartBackend(ctx, b.ID); err != nil {
		return err
	}
	back := e.since()
	down = false
	e.kv.setTargets(e.tgt.Backends())
	fr.event("started %s again; it answers", b.ID)
	fr.detected(b.ID+" answering again", back)
	if err := fr.watchBackend(ctx, b.ID, true, back); err != nil {
		return err
	}
	fr.observe(ctx)
	fr.res.Returned = fr.moved(fr.snapshot(ctx, "after"), b.ID)
	return nil
}

func (fr *faultRun) backendRemove(ctx context.Context, b Backend, via Router) error {
	e := fr.e
	ack, err := e.removeBackend(ctx, via, b.ID)
	at := e.since()
	if err != nil {
		return err
	}
	e.removed = &b
	fr.res.RemovalEpoch, fr.res.removalAck = ack.Epoch, at
	fr.event("removal of %s committed at epoch %d (written through %s)", b.ID, ack.Epoch, via.Name)
	fr.settle("removal acknowledged", at)
	fr.observe(ctx)
	fr.res.Moved = fr.moved(fr.snapshot(ctx, "after"), b.ID)
	return nil
}

func (fr *faultRun) backendAdd(ctx context.Context, b Backend, via Router) error {
	e := fr.e
	// a new instance starts cold: empty the returning one's prefix cache
	if err := e.resetCache(ctx, b); err != nil {
		fr.note("could not empty %s's prefix cache before adding it (it joins warm): %v", b.ID, err)
	} else {
		fr.event("emptied %s's prefix cache (a new instance starts cold)", b.ID)
	}
	ack, err := e.addBackend(ctx, via, b)
	at := e.since()
	if err != nil {
		return err
	}
	e.removed = nil
	fr.event("%s added at epoch %d (written through %s)", b.ID, ack.Epoch, via.Name)
	fr.settle("addition acknowledged", at)
	fr.observe(ctx)
	fr.res.Moved = fr.moved(fr.snapshot(ctx, "after"), b.ID)
	return nil
}

func (fr *faultRun) restartAll(ctx context.Context) error {
	e := fr.e
	e.rot.setAll(false)
	from := e.since()
	err := e.tgt.StopAll(ctx)
	to := e.since()
	for _, r := range e.routers {
		fr.res.Outages = append(fr.res.Outages, Outage{Router: r.Name, From: from, To: to})
	}
	for _, b := range e.backends {
		fr.res.Outages = append(fr.res.Outages, Outage{Backend: b.ID, From: from, To: to})
	}
	if err != nil {
		return err
	}
	fr.event("stopped every router and backend in %.1fs", (to - from).Seconds())
	if err := e.tgt.StartAll(ctx); err != nil {
		return err
	}
	e.kv.setTargets(e.tgt.Backends())
	fr.event("started everything again")
	var last time.Duration
	for _, r := range e.routers {
		at, err := e.waitReady(ctx, r)
		if err != nil {
			return err
		}
		e.rot.set(r.Name, true)
		last = max(last, at)
	}
	fr.event("every router ready, %.1fs after the stop began", (last - from).Seconds())
	fr.settle("all routers back", last)
	fr.observe(ctx)
	fr.res.Returned = fr.moved(fr.snapshot(ctx, "after"), "")
	return nil
}
