package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseLongOptions(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.phase("long") {
		t.Fatal("the long phase runs by default")
	}
	o, err = parseOptions([]string{"-phases", "long"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.LongSizes) != 2 || o.LongSizes[0] != 400000 || o.LongSizes[1] != 8192 || o.LongRate != 100 ||
		o.LongConns != 64 || o.LongDuration != 10*time.Second {
		t.Fatalf("long defaults: %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-phases", "long", "-long-sizes", "400000,x"}, "bad size"},
		{[]string{"-phases", "long", "-long-sizes", "10"}, "bad size"},
		{[]string{"-phases", "long", "-long-sizes", "17000000"}, "bad size"},
		{[]string{"-phases", "long", "-long-sizes", "8192,8192"}, "given twice"},
		{[]string{"-phases", "long", "-long-sizes", "2000,3000,4000,5000,6000"}, "at most 4"},
		{[]string{"-phases", "long", "-long-rate", "0"}, "-long-rate"},
		{[]string{"-phases", "long", "-long-rate", "5000"}, "-long-rate"},
		{[]string{"-phases", "long", "-long-conns", "0"}, "-long-conns 0"},
		{[]string{"-phases", "long", "-long-conns", "2", "-long-rate", "1000"}, "too few"},
		{[]string{"-phases", "long", "-long-duration", "500ms"}, "-long-duration"},
		{[]string{"-phases", "long", "-long-warmup", "-1s"}, "-long-warmup"},
	} {
		_, err := parseOptions(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	// The long settings are not checked without the phase.
	if _, err := parseOptions([]string{"-long-rate", "0"}); err != nil {
		t.Errorf("long flags checked without the long phase: %v", err)
	}
}

// The long phase's client sends at its rate whatever the answers take,
// counts only what started after the warm-up, reads whole answers, and
// counts a tick with every connection busy as late.
func TestLongClient(t *testing.T) {
	var got atomic.Int64
	var slow atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if len(b) != 2048 || r.URL.Path != "/v1/chat/completions" {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		got.Add(1)
		if slow.Load() {
			time.Sleep(300 * time.Millisecond)
		}
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer srv.Close()
	bodies, err := workload{BodySize: 2048, Prefixes: 2, Suffixes: 2}.bodies()
	if err != nil {
		t.Fatal(err)
	}
	c := newLongClient(srv.URL, bodies, 50, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.run(ctx, time.Second, time.Now().Add(400*time.Millisecond))
	if n := got.Load(); n != 50 {
		t.Errorf("the server got %d requests in 1s at 50/s, want 50", n)
	}
	if s, ok := c.sent.Load(), c.ok.Load(); s < 28 || s > 32 || ok != s || c.failed.Load() != 0 || c.late.Load() != 0 {
		t.Errorf("counted %d sent, %d ok, %d failed, %d late; want 30 sent after the warm-up, all ok", s, ok, c.failed.Load(), c.late.Load())
	}
	if len(c.lat) != int(c.ok.Load()) || percentile(c.lat, 99) <= 0 {
		t.Errorf("%d latencies for %d answers", len(c.lat), c.ok.Load())
	}
	// Answers slower than conns/rate: the ticks that find every
	// connection busy are late.
	slow.Store(true)
	c = newLongClient(srv.URL, bodies, 50, 2)
	c.run(ctx, 500*time.Millisecond, time.Now())
	if c.late.Load() == 0 || c.sent.Load()+c.late.Load() != 25 {
		t.Errorf("slow answers: %d sent, %d late; want some late, 25 in all", c.sent.Load(), c.late.Load())
	}
}

// A target that answers with an error status or an answer over the bound
// fails the request, and the client reads no more than the bound.
func TestLongClientBadAnswers(t *testing.T) {
	huge := strings.Repeat("x", maxLongAnswer+100)
	for _, tc := range []struct {
		name, want string
		h          http.HandlerFunc
	}{
		{"status", "status 500", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			http.Error(w, "no", http.StatusInternalServerError)
		}},
		{"too large", "answer over 1MiB", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, huge)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			bodies, err := workload{BodySize: 2048, Prefixes: 1, Suffixes: 1}.bodies()
			if err != nil {
				t.Fatal(err)
			}
			c := newLongClient(srv.URL, bodies, 20, 4)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c.run(ctx, 200*time.Millisecond, time.Now())
			if c.ok.Load() != 0 || c.failed.Load() != c.sent.Load() || c.sent.Load() == 0 ||
				len(c.samples) == 0 || !strings.Contains(c.samples[0], tc.want) {
				t.Fatalf("%d sent, %d ok, %d failed, samples %q; want every one failed with %q",
					c.sent.Load(), c.ok.Load(), c.failed.Load(), c.samples, tc.want)
			}
		})
	}
}

// The summary takes medians over valid runs, added latency against the
// same repetition's direct run, and ratios where both proxies' runs are
// valid.
func TestSummariseLong(t *testing.T) {
	r := &results{Options: options{Reps: 2, LongSizes: []int{400000}}}
	mk := func(rep int, tgt string, cpu float64, p50 time.Duration, invalid string) longRun {
		return longRun{Rep: rep, Target: tgt, Size: 400000, CPUPerReqUs: cpu, CoresPer100: cpu * 100 / 1e6,
			P50: p50, P99: 2 * p50, PeakRSS: 20 << 20, Invalid: invalid}
	}
	r.Long = []longRun{
		mk(0, "direct", 0, time.Millisecond, ""), mk(0, "haproxy", 800, 2*time.Millisecond, ""), mk(0, "warmroute", 400, 3*time.Millisecond, ""),
		mk(1, "direct", 0, time.Millisecond, ""), mk(1, "haproxy", 900, 2*time.Millisecond, ""), mk(1, "warmroute", 100, time.Millisecond, "3 of 1000 requests failed"),
	}
	r.summariseLong()
	var wr longRow
	for _, row := range r.LongRows {
		if row.Target == "warmroute" {
			wr = row
		}
	}
	if wr.Runs != 2 || wr.Valid != 1 || wr.CPUPerReqUs.Median != 400 || wr.AddedP50ms.Median != 2 || wr.PeakRSSMB.Median != 20 {
		t.Fatalf("warmroute row %+v", wr)
	}
	if len(r.LongRatios) != 1 || r.LongRatios[0].Ratio.Median != 0.5 || r.LongRatios[0].Ratio.Min != 0.5 {
		t.Fatalf("ratios %+v", r.LongRatios)
	}
	md := r.markdown()
	if !strings.Contains(md, "| 400000 | warmroute | 400.0 | 0.0400 |") || !strings.Contains(md, "at 400000 bytes: 0.50x") {
		t.Errorf("markdown:\n%s", md)
	}
}
