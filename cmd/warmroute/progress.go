package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runLength is how long one load run lasts: its warm-up, then its
// measured part (0 with a request count instead, as a trace replay).
type runLength struct {
	warmup, duration time.Duration
	requests         int
}

// progressWriter rewrites the load runner's status lines ("rag
// PREFIX_AWARE  25s/20s  sent 1480  ok 1400 ... 21.6 req/s", where the
// elapsed time includes the warm-up that the figure after the slash
// leaves out, and the rate is the measured answers over the whole time)
// into true ones: the time elapsed against the whole run (warm-up plus
// measured part), the phase, and the rates over the last interval. It
// passes other lines through, and numbers the runs of a comparison from
// its "starting a cold fleet" lines. Lines it does not recognise are
// written unchanged.
type progressWriter struct {
	mu      sync.Mutex
	w       io.Writer
	now     func() time.Time
	started time.Time
	runs    int                  // runs in all (0: one run, not numbered)
	lengths map[string]runLength // by workload name
	single  runLength            // the length when lengths is nil
	buf     []byte

	run      int    // current run, 1-based
	workload string // of the current run
	prev     progressSample
}

// progressSample is what the last status line of the current run said.
type progressSample struct {
	at             time.Time
	sent, answered int64
	measuring      bool
	ok             bool
}

func newProgressWriter(w io.Writer, runs int, lengths map[string]runLength) *progressWriter {
	return &progressWriter{w: w, now: time.Now, started: time.Now(), runs: runs, lengths: lengths}
}

var (
	// The runner's status line (loadtest's run.progress).
	runnerLine = regexp.MustCompile(`^(.*?)\s+(\d+)s(?:/\d+s)?  sent (\d+)  ok (\d+)  failed (\d+)  in flight (\d+)  [0-9.]+ req/s(.*)$`)
	// The comparison's line as it starts a run (compare's Plan.one).
	runStartLine = regexp.MustCompile(`^(\S+) / (\S+): starting a cold fleet`)
)

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := string(p.buf[:i])
		p.buf = p.buf[i+1:]
		if _, err := io.WriteString(p.w, p.rewrite(line)+"\n"); err != nil {
			return len(b), err
		}
	}
}

// rewrite returns what to print for one line.
func (p *progressWriter) rewrite(line string) string {
	now := p.now()
	if m := runStartLine.FindStringSubmatch(line); m != nil {
		p.run++
		p.workload = m[1]
		p.prev = progressSample{}
		if p.runs > 0 {
			return fmt.Sprintf("%s  [run %d of %d; %s since the demo started]", line, p.run, p.runs, clock(now.Sub(p.started)))
		}
		return line
	}
	m := runnerLine.FindStringSubmatch(line)
	if m == nil {
		return line
	}
	num := func(i int) int64 { n, _ := strconv.ParseInt(m[i], 10, 64); return n }
	label := strings.TrimSpace(m[1])
	el := time.Duration(num(2)) * time.Second
	sent, ok, failed, inflight := num(3), num(4), num(5), num(6)
	rest := m[7] // "  kv hit 93%", or nothing
	ln := p.single
	if l, found := p.lengths[p.workload]; found {
		ln = l
	}
	total := ln.warmup + ln.duration
	phase := "measuring"
	switch {
	case el < ln.warmup:
		phase = "warm-up"
	case ln.duration > 0 && el >= total:
		phase = "draining"
	case ln.duration == 0 && ln.requests > 0 && sent >= int64(ln.requests):
		phase = "draining"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-24s ", label)
	if ln.duration > 0 {
		fmt.Fprintf(&b, "%s of %s", clock(el), clock(total))
	} else {
		fmt.Fprintf(&b, "%s", clock(el))
	}
	fmt.Fprintf(&b, " %-9s", phase)
	if ln.duration == 0 && ln.requests > 0 {
		fmt.Fprintf(&b, "  sent %d of %d", sent, ln.requests)
	} else {
		fmt.Fprintf(&b, "  sent %d", sent)
	}
	fmt.Fprintf(&b, "  ok %d  failed %d  in flight %d", ok, failed, inflight)
	// Rates over the interval since the last line: requests sent, and
	// answers (counted only once the measured part began, so only when
	// the whole interval was measured).
	answered := ok + failed
	cur := progressSample{at: now, sent: sent, answered: answered, measuring: phase != "warm-up", ok: true}
	if p.prev.ok {
		if dt := now.Sub(p.prev.at).Seconds(); dt > 0 {
			fmt.Fprintf(&b, "  now %.1f req/s sent", float64(sent-p.prev.sent)/dt)
			if p.prev.measuring && cur.measuring {
				fmt.Fprintf(&b, ", %.1f answered", float64(answered-p.prev.answered)/dt)
			}
		}
	}
	p.prev = cur
	b.WriteString(rest)
	if p.runs > 0 {
		fmt.Fprintf(&b, "  [run %d of %d]", p.run, p.runs)
	}
	return b.String()
}

// clock formats d as m:ss.
func clock(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
