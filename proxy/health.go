package proxy

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// startProber runs the active health check until Shutdown.
func (p *Proxy) startProber() {
	if p.cfg.ProbePath == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proberStarted || p.shutdown {
		return
	}
	p.proberStarted = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// Rounds run four times per interval: a backend that is down or
		// ejected is probed every round, so it is back soon after it
		// answers again; a healthy one every ProbeInterval.
		tick := time.NewTicker(p.cfg.ProbeInterval / 4)
		defer tick.Stop()
		var probes sync.WaitGroup
		defer probes.Wait()
		for {
			p.probeAll(&probes)
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
}

// probeAll starts a probe of every backend of the current table that is
// due and whose last probe has finished. It does not wait: a backend whose
// probes time out (unreachable, a partition) must not delay the others.
func (p *Proxy) probeAll(probes *sync.WaitGroup) {
	t := p.tab.Load()
	now := time.Now()
	for _, b := range t.bs {
		due := b.probeDown.Load() || b.ejectedUntil.Load() > now.UnixNano() ||
			now.Sub(time.Unix(0, b.lastProbe.Load())) >= p.cfg.ProbeInterval-p.cfg.ProbeInterval/8
		if !due || !b.probing.CompareAndSwap(false, true) {
			continue
		}
		b.lastProbe.Store(now.UnixNano())
		probes.Add(1)
		go func() {
			defer probes.Done()
			defer b.probing.Store(false)
			p.probe(b)
		}()
	}
}

// maxProbeBody bounds the body of a health-check answer; a larger one fails
// the check.
const maxProbeBody = 64 << 10

var errProbeBodyTooLarge = errors.New("health check answer over 64 KiB")

// probe requests ProbePath; any 2xx with a body of at most maxProbeBody
// bytes is a success. The body is streamed and read (within ProbeTimeout)
// only up to that bound, so nothing a backend declares (a Content-Length
// of exabytes) is ever allocated.
func (p *Proxy) probe(b *backend) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI(p.cfg.ProbePath)
	req.Header.SetHost(b.target.HostPort)
	resp.StreamBody = true
	err := b.client.DoTimeout(req, resp, p.cfg.ProbeTimeout)
	if err == nil {
		err = drainProbe(resp)
	}
	ok := err == nil && resp.StatusCode() >= 200 && resp.StatusCode() < 300
	if p.cfg.OnProbe != nil {
		p.cfg.OnProbe(b.id, ok)
	}

	b.probeMu.Lock()
	defer b.probeMu.Unlock()
	if ok {
		// A passing probe ends a passive ejection early: the backend
		// answers again, and keeping it out for the rest of EjectFor would
		// make this router route its prompts elsewhere while the others,
		// which never ejected it, do not.
		if b.ejectedUntil.Load() != 0 {
			b.ejectedUntil.Store(0)
			b.connFails.Store(0)
		}
		b.probeFails = 0
		b.probeOKs++
		if b.probeDown.Load() && b.probeOKs >= p.cfg.ProbeRiseThreshold {
			b.probeDown.Store(false)
			p.log.Info("backend healthy again", "backend", b.id)
		}
		return
	}
	b.probeOKs = 0
	b.probeFails++
	if !b.probeDown.Load() && b.probeFails >= p.cfg.ProbeFailThreshold {
		b.probeDown.Store(true)
		reason := "status"
		if err != nil {
			reason = err.Error()
		}
		p.log.Warn("backend failed health checks", "backend", b.id, "reason", reason)
	}
}

// drainProbe reads and drops a probe answer's streamed body, at most
// maxProbeBody bytes, and closes it: the connection goes back to the pool
// when the body was read to its end, and is closed otherwise. A status
// outside 2xx-5xx (a switch of protocols) closes the connection too (see
// closeUpstream).
func drainProbe(resp *fasthttp.Response) error {
	if sc := resp.StatusCode(); sc < 200 || sc > 599 {
		closeUpstream(resp)
	}
	bs, ok := resp.BodyStream().(fasthttp.ReadCloserWithError)
	if !ok || bs == nil {
		return nil
	}
	n, err := io.CopyN(io.Discard, bs, maxProbeBody+1)
	switch {
	case errors.Is(err, io.EOF):
		err = nil
	case err == nil && n > maxProbeBody:
		err = errProbeBodyTooLarge
	}
	_ = bs.CloseWithError(err)
	return err
}
