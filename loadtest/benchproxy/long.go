package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The long-prompt phase (-phases long): chat requests whose bodies are
// -long-sizes bytes (400,000 by default, about 100k tokens, and 8,192),
// sent at a fixed rate (-long-rate) whatever the answers take, through
// HAProxy's body hash and warmroute in the same run, and straight to the
// stubs for the latency a proxy adds. Per target and size: the proxy's
// CPU per request over the measured window (and in cores per 100
// requests/s), the requests' latency from the first byte sent to the
// answer's last byte read, and the proxy's RSS at its peak.

// Bounds of the long-prompt settings.
const (
	maxLongSize  = 16 << 20
	minLongSize  = 1 << 10
	maxLongRate  = 2000
	maxLongConns = 1024
	maxLongSizes = 4
)

// longRun is one target's run at one body size.
type longRun struct {
	Rep    int     `json:"rep"`
	Target string  `json:"target"`
	Size   int     `json:"size"`
	Rate   float64 `json:"rate"`
	// Sent, OK and Errors count the requests started in the measured
	// window; Late counts the ticks that found every connection busy (the
	// target fell behind the rate): the run is then invalid.
	Sent   int64 `json:"sent"`
	OK     int64 `json:"ok"`
	Errors int64 `json:"errors"`
	Late   int64 `json:"late"`
	// ErrorSamples are the first errors' texts.
	ErrorSamples []string      `json:"error_samples,omitempty"`
	Window       time.Duration `json:"window_ns"`
	// CPU is the proxy's utime+stime over the window; CPUPerReqUs that
	// over the requests answered, and CoresPer100 the cores that makes at
	// 100 requests/s.
	CPU         time.Duration `json:"cpu_ns"`
	CPUPerReqUs float64       `json:"cpu_per_req_us"`
	CoresPer100 float64       `json:"cores_per_100_rps"`
	P50         time.Duration `json:"p50_ns"`
	P99         time.Duration `json:"p99_ns"`
	// IdleRSS is the proxy's RSS before the run, PeakRSS its highest over
	// the window (sampled every 100ms).
	IdleRSS int64  `json:"idle_rss"`
	PeakRSS int64  `json:"peak_rss"`
	Invalid string `json:"invalid,omitempty"`
}

func (r longRun) isProxy() bool { return r.Target != "direct" }

func (r longRun) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rep %d %-9s long %7d bytes at %.0f/s: %d sent, %d ok, %d errors, %d late  latency p50 %7.2fms p99 %7.2fms",
		r.Rep, r.Target, r.Size, r.Rate, r.Sent, r.OK, r.Errors, r.Late, ms(r.P50), ms(r.P99))
	if r.isProxy() {
		fmt.Fprintf(&b, "  cpu %7.1fus/req (%.3f cores per 100 req/s)  rss peak %.1fMB (idle %.1fMB)",
			r.CPUPerReqUs, r.CoresPer100, float64(r.PeakRSS)/(1<<20), float64(r.IdleRSS)/(1<<20))
	}
	if r.Invalid != "" {
		fmt.Fprintf(&b, "  INVALID: %s", r.Invalid)
	}
	return b.String()
}

// parseLongSizes reads -long-sizes: body sizes in bytes, comma-separated.
func parseLongSizes(s string) ([]int, error) {
	return parseIntList("-long-sizes", "size", s, minLongSize, maxLongSize, maxLongSizes, " bytes")
}

// validateLong checks the long-prompt settings.
func (o *options) validateLong() error {
	switch {
	case o.LongRate <= 0 || o.LongRate > maxLongRate:
		return fmt.Errorf("-long-rate %g: above 0, at most %d requests/s", o.LongRate, maxLongRate)
	case o.LongConns < 1 || o.LongConns > maxLongConns:
		return fmt.Errorf("-long-conns %d: 1 to %d", o.LongConns, maxLongConns)
	case o.LongDuration < time.Second || o.LongDuration > 10*time.Minute:
		return fmt.Errorf("-long-duration %s: 1s to 10m", o.LongDuration)
	case o.LongWarmup < 0 || o.LongWarmup > time.Minute:
		return fmt.Errorf("-long-warmup %s: 0 to 1m", o.LongWarmup)
	case float64(o.LongConns) < o.LongRate*0.01:
		return fmt.Errorf("-long-conns %d: too few for %g requests/s (one per 10ms of latency is needed)", o.LongConns, o.LongRate)
	}
	return nil
}

// longClient sends bodies at a fixed rate over at most conns keep-alive
// connections.
type longClient struct {
	url    string
	bodies [][]byte
	rate   float64
	hc     *http.Client
	sem    chan struct{}

	mu      sync.Mutex
	lat     []time.Duration
	samples []string
	sent    atomic.Int64
	ok      atomic.Int64
	failed  atomic.Int64
	late    atomic.Int64
}

// maxLongAnswer bounds an answer's body read by the client.
const maxLongAnswer = 1 << 20

func newLongClient(url string, bodies [][]byte, rate float64, conns int) *longClient {
	tr := &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		DisableCompression: true, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	return &longClient{url: url + "/v1/chat/completions", bodies: bodies, rate: rate,
		hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}, sem: make(chan struct{}, conns)}
}

// run sends until d has passed; requests started at or after measureFrom
// are counted. It returns when every request started has ended.
func (c *longClient) run(ctx context.Context, d time.Duration, measureFrom time.Time) {
	defer c.hc.CloseIdleConnections()
	gap := time.Duration(float64(time.Second) / c.rate)
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * gap)
		if at.Sub(start) >= d {
			return
		}
		if w := time.Until(at); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		counted := !at.Before(measureFrom)
		select {
		case c.sem <- struct{}{}:
		default:
			if counted {
				c.late.Add(1)
			}
			continue
		}
		if counted {
			c.sent.Add(1)
		}
		wg.Add(1)
		go func(body []byte) {
			defer wg.Done()
			defer func() { <-c.sem }()
			lat, err := c.one(ctx, body)
			if !counted {
				return
			}
			if err != nil {
				c.failed.Add(1)
				c.mu.Lock()
				if len(c.samples) < 5 {
					c.samples = append(c.samples, err.Error())
				}
				c.mu.Unlock()
				return
			}
			c.ok.Add(1)
			c.mu.Lock()
			c.lat = append(c.lat, lat)
			c.mu.Unlock()
		}(c.bodies[i%len(c.bodies)])
	}
}

// one sends body and reads the whole answer; it returns the time from
// the request's start to the answer's last byte.
func (c *longClient) one(ctx context.Context, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxLongAnswer+1))
	lat := time.Since(t0)
	switch {
	case err != nil:
		return 0, err
	case n > maxLongAnswer:
		return 0, errors.New("answer over 1MiB")
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return lat, nil
}

// measureLong runs one target at one body size.
func measureLong(ctx context.Context, t target, bodies [][]byte, size int, o options) (longRun, error) {
	r := longRun{Target: t.Name, Size: size, Rate: o.LongRate}
	var pid int
	if t.process != nil {
		pid = t.process.Pid()
		rss, err := proc.RSS(pid)
		if err != nil {
			return r, err
		}
		r.IdleRSS = rss
	}
	c := newLongClient(t.URL, bodies, o.LongRate, o.LongConns)
	measureFrom := time.Now().Add(o.LongWarmup)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx, o.LongWarmup+o.LongDuration, measureFrom)
	}()
	// The window: from the warm-up's end to the last request's end.
	if err := sleepCtx(ctx, time.Until(measureFrom)); err != nil {
		<-done
		return r, err
	}
	var cpu0 time.Duration
	if pid != 0 {
		var err error
		if cpu0, err = cpuTime(pid); err != nil {
			<-done
			return r, err
		}
	}
	w0 := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			if pid != 0 {
				if rss, err := proc.RSS(pid); err == nil {
					r.PeakRSS = max(r.PeakRSS, rss)
				}
			}
		}
	}
	r.Window = time.Since(w0)
	if pid != 0 {
		cpu1, err := cpuTime(pid)
		if err != nil {
			return r, err
		}
		r.CPU = cpu1 - cpu0
		if rss, err := proc.RSS(pid); err == nil {
			r.PeakRSS = max(r.PeakRSS, rss)
		}
	}
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.Sent, r.OK, r.Errors, r.Late = c.sent.Load(), c.ok.Load(), c.failed.Load(), c.late.Load()
	r.ErrorSamples = c.samples
	r.P50, r.P99 = percentile(c.lat, 50), percentile(c.lat, 99)
	if r.OK > 0 {
		r.CPUPerReqUs = us(r.CPU) / float64(r.OK)
		r.CoresPer100 = r.CPUPerReqUs * 100 / 1e6
	}
	var invalid []string
	if r.Errors > 0 {
		invalid = append(invalid, fmt.Sprintf("%d of %d requests failed", r.Errors, r.Sent))
	}
	if r.Late > 0 {
		invalid = append(invalid, fmt.Sprintf("%d requests not sent on time: all %d connections busy", r.Late, o.LongConns))
	}
	r.Invalid = strings.Join(invalid, "; ")
	return r, nil
}

// longBodies returns the long phase's bodies for each size.
func longBodies(o options) (map[int][][]byte, error) {
	out := make(map[int][][]byte, len(o.LongSizes))
	for _, size := range o.LongSizes {
		b, err := workload{BodySize: size, Prefixes: o.Prefixes, Suffixes: o.Suffixes}.bodies()
		if err != nil {
			return nil, fmt.Errorf("long bodies of %d bytes: %w", size, err)
		}
		out[size] = b
	}
	return out, nil
}

// longRow summarises one target at one size over its valid repetitions.
type longRow struct {
	Target      string `json:"target"`
	Size        int    `json:"size"`
	Runs        int    `json:"runs"`
	Valid       int    `json:"valid"`
	CPUPerReqUs spread `json:"cpu_per_req_us"`
	CoresPer100 spread `json:"cores_per_100_rps"`
	P50ms       spread `json:"p50_ms"`
	P99ms       spread `json:"p99_ms"`
	AddedP50ms  spread `json:"added_p50_ms"`
	AddedP99ms  spread `json:"added_p99_ms"`
	PeakRSSMB   spread `json:"peak_rss_mb"`
}

// longRatio is warmroute's CPU per request over HAProxy's at one size,
// per repetition in which both runs are valid.
type longRatio struct {
	Size  int    `json:"size"`
	Ratio spread `json:"ratio"`
}

func (r *results) findLong(rep int, tgt string, size int) (longRun, bool) {
	return firstWhere(r.Long, func(l longRun) bool { return l.Rep == rep && l.Target == tgt && l.Size == size })
}

func (r *results) summariseLong() {
	r.LongRows, r.LongRatios = nil, nil
	for _, size := range r.Options.LongSizes {
		for _, tgt := range r.targetNames() {
			row := longRow{Target: tgt, Size: size}
			var cpu, cores, p50, p99, a50, a99, rss []float64
			for _, l := range r.Long {
				if l.Target != tgt || l.Size != size {
					continue
				}
				row.Runs++
				if l.Invalid != "" {
					continue
				}
				row.Valid++
				p50, p99 = append(p50, ms(l.P50)), append(p99, ms(l.P99))
				if d, ok := r.findLong(l.Rep, "direct", size); ok && d.Invalid == "" && l.isProxy() {
					a50, a99 = append(a50, ms(l.P50-d.P50)), append(a99, ms(l.P99-d.P99))
				}
				if l.isProxy() {
					cpu, cores = append(cpu, l.CPUPerReqUs), append(cores, l.CoresPer100)
					rss = append(rss, float64(l.PeakRSS)/(1<<20))
				}
			}
			if row.Runs == 0 {
				continue
			}
			row.CPUPerReqUs, row.CoresPer100, row.P50ms, row.P99ms = spreadOf(cpu), spreadOf(cores), spreadOf(p50), spreadOf(p99)
			row.AddedP50ms, row.AddedP99ms, row.PeakRSSMB = spreadOf(a50), spreadOf(a99), spreadOf(rss)
			r.LongRows = append(r.LongRows, row)
		}
		var ratios []float64
		for rep := 0; rep < r.Options.Reps; rep++ {
			w, ok1 := r.findLong(rep, "warmroute", size)
			h, ok2 := r.findLong(rep, "haproxy", size)
			if ok1 && ok2 && w.Invalid == "" && h.Invalid == "" && h.CPUPerReqUs > 0 {
				ratios = append(ratios, w.CPUPerReqUs/h.CPUPerReqUs)
			}
		}
		if len(ratios) > 0 {
			r.LongRatios = append(r.LongRatios, longRatio{Size: size, Ratio: spreadOf(ratios)})
		}
	}
}

// longHeading says what the long phase measured.
func (r *results) longHeading() string {
	o := r.Options
	return fmt.Sprintf("Long prompts: chat bodies of %s bytes at %g requests/s (open loop, at most %d connections), %s warm-up then %s measured per target and size, interleaved; median over the valid ones of %d repetitions (min-max). CPU is the proxy's utime+stime over the window per request answered; latency is from the request's first byte to the answer's last; added latency is the proxy's p50 or p99 minus the direct run's of the same repetition; RSS is the proxy's peak over the window.",
		joinInts(o.LongSizes), o.LongRate, o.LongConns, o.LongWarmup, o.LongDuration, o.Reps)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

var longColumns = []string{"bytes", "target", "CPU us/req", "cores per 100 req/s", "p50 ms", "p99 ms",
	"added p50 ms", "added p99 ms", "peak RSS MB", "valid"}

// cells renders the row's cells, in longColumns' order: "-" where no
// repetition was valid, and for the proxy's own figures on direct.
func (x longRow) cells() []string {
	fig := func(s spread, prec int, proxyOnly bool) string {
		if x.Valid == 0 || (proxyOnly && x.Target == "direct") {
			return "-"
		}
		return s.fmt(prec, "")
	}
	return []string{strconv.Itoa(x.Size), x.Target, fig(x.CPUPerReqUs, 1, true), fig(x.CoresPer100, 4, true),
		fig(x.P50ms, 2, false), fig(x.P99ms, 2, false), fig(x.AddedP50ms, 2, true), fig(x.AddedP99ms, 2, true),
		fig(x.PeakRSSMB, 1, true), fmt.Sprintf("%d of %d", x.Valid, x.Runs)}
}

func (r *results) longCells() [][]string {
	rows := make([][]string, 0, len(r.LongRows))
	for _, x := range r.LongRows {
		rows = append(rows, x.cells())
	}
	return rows
}

func (r *results) longText(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s\n", r.longHeading())
	writeAligned(b, longColumns, r.longCells())
	for _, q := range r.LongRatios {
		fmt.Fprintf(b, "warmroute / haproxy CPU per request at %d bytes: %s\n", q.Size, q.Ratio.fmt(2, "x"))
	}
	for _, l := range r.Long {
		if l.Invalid != "" {
			fmt.Fprintf(b, "invalid: rep %d %s %d bytes: %s %v\n", l.Rep, l.Target, l.Size, l.Invalid, l.ErrorSamples)
		}
	}
}

func (r *results) longMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s\n\n", r.longHeading())
	writeMarkdownTable(b, longColumns, r.longCells())
	if len(r.LongRatios) > 0 {
		b.WriteString("\n")
		for _, q := range r.LongRatios {
			fmt.Fprintf(b, "warmroute / HAProxy CPU per request at %d bytes: %s\n", q.Size, q.Ratio.fmt(2, "x"))
		}
	}
}

// runLongRep runs one repetition of the long phase: every size, every
// target, the targets' order rotated by rep.
func runLongRep(ctx context.Context, targets []target, o options, bodies map[int][][]byte, rep int, res *results, stdout io.Writer) error {
	for _, size := range o.LongSizes {
		for k := range targets {
			t := targets[(k+rep)%len(targets)]
			r, err := measureLong(ctx, t, bodies[size], size, o)
			if err != nil {
				return fmt.Errorf("long %s %d bytes: %w", t.Name, size, err)
			}
			r.Rep = rep
			res.Long = append(res.Long, r)
			fmt.Fprintln(stdout, r.line())
		}
	}
	return nil
}
