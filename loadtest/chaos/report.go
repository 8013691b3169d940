package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Acceptance bounds.
const (
	// MaxReconverge is the longest time from a change settling to 100%
	// agreement.
	MaxReconverge = 2 * time.Second
	// MoveSlack is what a removal may move beyond the ideal 1/N.
	MoveSlack = 0.05
)

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func fmtDelay(d time.Duration, ok bool) string {
	if !ok {
		return "never"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// Columns of the table.
var columns = []string{"fault", "victim", "requests", "errors unavoidable/faulted/other",
	"agreement min picks/owners", "back to 100% picks/owners", "prefixes moved", "hit rate before -> min", "hit rate back"}

// row formats one result.
func row(r *Result) []string {
	if r.Skipped != "" {
		return []string{string(r.Fault), "-", "-", "skipped", "-", "-", "-", "-", "-"}
	}
	victim := r.Victim
	if victim == "" {
		victim = "all"
	}
	out := []string{string(r.Fault), victim, fmt.Sprint(r.Errors.Requests),
		fmt.Sprintf("%d/%d/%d", r.Errors.Unavoidable, r.Errors.Faulted, r.Errors.Other)}
	if r.AgreementSeen {
		out = append(out, pct(r.AgreementMin)+" / "+pct(r.OwnerAgreementMin))
	} else {
		out = append(out, "n/a")
	}
	wp, ok := r.Worst(Picks)
	wo, _ := r.Worst(Owners)
	if !ok {
		out = append(out, "-")
	} else {
		out = append(out, fmt.Sprintf("%s / %s (%s)", fmtDelay(wp.delay(Picks)), fmtDelay(wo.delay(Owners)), wp.What))
	}
	out = append(out, moved(r))
	if r.KV.Measured {
		out = append(out, pct(r.KV.Before)+" -> "+pct(r.KV.Min))
		switch {
		case !r.KV.RecoveredOK:
			out = append(out, ">"+secs(r.KV.Recovered))
		case r.KV.Recovered == 0:
			out = append(out, "no dip")
		default:
			out = append(out, secs(r.KV.Recovered))
		}
	} else {
		out = append(out, "n/a", "n/a")
	}
	if r.Failed != "" {
		out[3] += " FAILED"
	}
	return out
}

// moved describes the prefix movement of a fault.
func moved(r *Result) string {
	m := r.Moved
	switch r.Fault {
	case BackendRemove:
		if m == nil {
			return "n/a"
		}
		return fmt.Sprintf("%s (owned %s)", pct(m.Fraction()), pct(float64(m.OwnedBefore)/float64(max(m.Prompts, 1))))
	case BackendAdd:
		if m == nil {
			return "n/a"
		}
		return fmt.Sprintf("%s (now owns %s)", pct(m.Fraction()), pct(float64(m.OwnedAfter)/float64(max(m.Prompts, 1))))
	}
	var parts []string
	if m != nil {
		parts = append(parts, pct(m.Fraction()))
	}
	if r.Returned != nil {
		parts = append(parts, "after "+pct(r.Returned.Fraction()))
	}
	if len(parts) == 0 {
		return "n/a"
	}
	return strings.Join(parts, ", ")
}

// WriteTable prints the reports as an aligned text table, or as a
// Markdown table with markdown, then a line of details per fault.
func WriteTable(w io.Writer, reps []Report, markdown bool) {
	for _, rep := range reps {
		fmt.Fprintf(w, "\n%s target: %s\n", rep.Target, rep.Describe)
		fmt.Fprintf(w, "load: %s workload at %g requests/s, %d requests in %.0fs; agreement sampled every %s\n\n",
			rep.Workload, rep.Rate, rep.Requests, rep.Duration.Seconds(), rep.ProbeResolution.Round(time.Millisecond))
		if markdown {
			fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(columns, " | "), strings.Repeat(" --- |", len(columns)))
			for i := range rep.Results {
				fmt.Fprintf(w, "| %s |\n", strings.Join(row(&rep.Results[i]), " | "))
			}
		} else {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, strings.Join(columns, "\t"))
			for i := range rep.Results {
				fmt.Fprintln(tw, strings.Join(row(&rep.Results[i]), "\t"))
			}
			tw.Flush()
		}
		fmt.Fprintln(w)
		for i := range rep.Results {
			for _, d := range details(&rep.Results[i]) {
				if markdown {
					fmt.Fprintf(w, "- %s: %s\n", rep.Results[i].Fault, d)
				} else {
					fmt.Fprintf(w, "  %s: %s\n", rep.Results[i].Fault, d)
				}
			}
		}
	}
}

// details are the facts that do not fit the table.
func details(r *Result) []string {
	if r.Skipped != "" {
		return []string{"skipped: " + r.Skipped}
	}
	var out []string
	if r.Failed != "" {
		out = append(out, "FAILED: "+r.Failed)
	}
	if len(r.Errors.ByKind) > 0 {
		var kinds []string
		for k, n := range r.Errors.ByKind {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
		out = append(out, "failures by kind: "+strings.Join(sorted(kinds), ", "))
	}
	for _, x := range r.Errors.Examples {
		line := fmt.Sprintf("failure not explained by the fault: %s via %s to %s, sent at %.2fs, ended at %.2fs (status %d, epoch %d)",
			x.Err, orNone(x.Router), orNone(x.Backend), (x.Start - r.Inject).Seconds(), (x.End - r.Inject).Seconds(), x.Status, x.Epoch)
		if x.Detail != "" {
			line += ": " + x.Detail
		}
		out = append(out, line)
	}
	if r.Errors.Redispatched > 0 {
		out = append(out, fmt.Sprintf("%d requests refused by a router and sent to the next one (as an L4 balancer retries)", r.Errors.Redispatched))
	}
	for _, s := range r.Settles {
		kind := ""
		if s.Detection {
			kind = " (detection, not held to the bound)"
		}
		out = append(out, fmt.Sprintf("after %s%s: picks back to 100%% agreement in %s, owners in %s", s.What, kind,
			fmtDelay(s.delay(Picks)), fmtDelay(s.delay(Owners))))
		if s.Sample != "" {
			out = append(out, "  first disagreement "+s.Sample)
		}
	}
	if r.Failover > 0 {
		out = append(out, fmt.Sprintf("new leader %s %.2fs after the kill", r.NewLeader, r.Failover.Seconds()))
	}
	if r.Fault == BackendRemove && r.RemovalEpoch > 0 {
		out = append(out, fmt.Sprintf("removal committed at epoch %d: %d requests reached %s at that epoch or later, %d started after the acknowledgement",
			r.RemovalEpoch, r.LateByEpoch, r.Victim, r.LateByTime))
	}
	if m := r.Moved; m != nil && m.Prompts > 0 && (r.Fault == BackendRemove || r.Fault == BackendAdd || r.Fault == BackendKill) {
		out = append(out, fmt.Sprintf("of %d probe prompts %d moved: %d from %s, %d to it, %d between other backends (%d backends before the change: 1/N = %s)",
			m.Prompts, m.Moved, m.FromBackend, r.Victim, m.ToBackend, m.Unneeded(), r.Backends, pct(1/float64(max(r.Backends, 1)))))
	}
	if r.KV.Measured && r.KV.Min < r.KV.Before {
		out = append(out, fmt.Sprintf("hit rate lowest %.1fs after the fault", r.KV.MinAt.Seconds()))
	}
	for _, ev := range r.Events {
		out = append(out, fmt.Sprintf("at %.1fs %s", (ev.At-r.Inject).Seconds(), ev.What))
	}
	out = append(out, r.Notes...)
	return out
}

// Check lists the acceptance criteria a report misses: no failed request
// on surviving routers for a router kill, pause or partition (and a
// leader kill); a removal moving at most 1/N + 5% of prefixes and no
// request reaching the removed backend at or past the removal's epoch;
// agreement at level back to 100% within 2 s of every change settling.
func Check(rep Report, level Level) []string {
	var bad []string
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Skipped != "" {
			continue
		}
		tag := rep.Target + " " + string(r.Fault)
		if r.Failed != "" {
			bad = append(bad, tag+": failed: "+r.Failed)
			continue
		}
		switch r.Fault {
		case RouterKill, RouterPause, RouterPartition, LeaderKill:
			if r.Errors.Other > 0 {
				bad = append(bad, fmt.Sprintf("%s: %d failed requests on surviving routers", tag, r.Errors.Other))
			}
		case BackendRemove:
			if r.Moved == nil {
				bad = append(bad, tag+": movement not measured")
			} else if bound := 1/float64(max(r.Backends, 1)) + MoveSlack; r.Moved.Fraction() > bound {
				bad = append(bad, fmt.Sprintf("%s: %s of prefixes moved, bound %s", tag, pct(r.Moved.Fraction()), pct(bound)))
			}
			if r.LateByEpoch > 0 {
				bad = append(bad, fmt.Sprintf("%s: %d requests reached %s after its removal was committed", tag, r.LateByEpoch, r.Victim))
			}
		}
		for _, s := range r.Settles {
			if s.Detection {
				continue
			}
			d, ok := s.delay(level)
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("%s: %s agreement not back to 100%% after %s", tag, level, s.What))
			case d > MaxReconverge:
				bad = append(bad, fmt.Sprintf("%s: %s agreement back to 100%% %.2fs after %s (bound %s)", tag, level, d.Seconds(), s.What, MaxReconverge))
			}
		}
	}
	return bad
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
