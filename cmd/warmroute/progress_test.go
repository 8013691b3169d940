package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestProgressWriter: the runner's status lines, whose elapsed time
// includes the warm-up but is shown against the measured part only and
// whose rate averages measured answers over the whole time, become the
// time against the whole run, the phase and the rates of the last
// interval; the comparison's lines number the runs.
func TestProgressWriter(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	pw := newProgressWriter(&out, 6, map[string]runLength{
		"rag":   {warmup: 8 * time.Second, duration: 20 * time.Second},
		"trace": {warmup: 15 * time.Second, requests: 1200},
	})
	now := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	pw.started = now
	pw.now = func() time.Time { return now }
	line := func(s string) { fmt.Fprintln(pw, s) }
	line("rag / PREFIX_AWARE: starting a cold fleet (7 instances, 3 router(s))")
	now = now.Add(5 * time.Second)
	line(fmt.Sprintf("%-24s %5.0fs/%.0fs  sent %d  ok %d  failed %d  in flight %d  %.1f req/s", "rag PREFIX_AWARE", 5.0, 20.0, 300, 0, 0, 40, 0.0))
	now = now.Add(5 * time.Second)
	line(fmt.Sprintf("%-24s %5.0fs/%.0fs  sent %d  ok %d  failed %d  in flight %d  %.1f req/s  kv hit 54%%", "rag PREFIX_AWARE", 10.0, 20.0, 600, 100, 0, 40, 10.0))
	now = now.Add(5 * time.Second)
	line(fmt.Sprintf("%-24s %5.0fs/%.0fs  sent %d  ok %d  failed %d  in flight %d  %.1f req/s  kv hit 80%%", "rag PREFIX_AWARE", 15.0, 20.0, 900, 390, 10, 40, 26.0))
	now = now.Add(15 * time.Second)
	line(fmt.Sprintf("%-24s %5.0fs/%.0fs  sent %d  ok %d  failed %d  in flight %d  %.1f req/s", "rag PREFIX_AWARE", 30.0, 20.0, 1680, 1300, 10, 2, 43.0))
	line("trace / CONSISTENT_HASH: starting a cold fleet (7 instances, 3 router(s))")
	line(fmt.Sprintf("%-24s %5.0fs  sent %d  ok %d  failed %d  in flight %d  %.1f req/s", "trace CONSISTENT_HASH", 20.0, 400, 100, 0, 5, 5.0))
	line("something else")

	got := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := []string{
		`^rag / PREFIX_AWARE: starting a cold fleet .*\[run 1 of 6; 0:00 since the demo started\]$`,
		`^rag PREFIX_AWARE\s+0:05 of 0:28 warm-up\s+sent 300  ok 0  failed 0  in flight 40  \[run 1 of 6\]$`,
		// The interval from warm-up into the measured part has no answer rate.
		`^rag PREFIX_AWARE\s+0:10 of 0:28 measuring\s+sent 600 .* now 60\.0 req/s sent  kv hit 54%  \[run 1 of 6\]$`,
		`^rag PREFIX_AWARE\s+0:15 of 0:28 measuring\s+sent 900 .* now 60\.0 req/s sent, 60\.0 answered  kv hit 80%`,
		`^rag PREFIX_AWARE\s+0:30 of 0:28 draining\s+.* now 52\.0 req/s sent, 60\.7 answered  \[run 1 of 6\]$`,
		`^trace / CONSISTENT_HASH: starting a cold fleet .*\[run 2 of 6; 0:30 since the demo started\]$`,
		`^trace CONSISTENT_HASH\s+0:20 measuring\s+sent 400 of 1200  ok 100`,
		`^something else$`,
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for i, w := range want {
		if !matches(w, got[i]) {
			t.Errorf("line %d:\n%s\ndoes not match\n%s", i, got[i], w)
		}
	}
}

func matches(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

func TestInstanceNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "gpu-0 gpu-1 gpu-2"},
		{[]string{"--itl-base", "20ms", "--name-prefix", "h100-"}, "h100-0 h100-1 h100-2"},
		{[]string{"-name-prefix=a"}, "a0 a1 a2"},
	} {
		if got := strings.Join(instanceNames(3, c.args), " "); got != c.want {
			t.Errorf("%q: %s, want %s", c.args, got, c.want)
		}
	}
}
