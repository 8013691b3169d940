package gpusim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestLoadCPUPerRequest measures what the simulator costs: one child
// process serves 7 instances with the default (unscaled) model while this
// process sends them an open-loop stream of ~2,000-token streaming chat
// requests. It reports the child's CPU time per request (getrusage in the
// child, read before and after the run) and checks that the fleet kept up.
//
//	GPUSIM_LOAD=1 go test -run TestLoadCPUPerRequest -v ./loadtest/gpusim
//
// GPUSIM_LOAD_RATE (requests/s, default 200), GPUSIM_LOAD_SECONDS (default
// 20) and GPUSIM_LOAD_STREAM_INTERVAL (tokens per chunk, default 1) change
// the run; GPUSIM_LOAD_CPUPROFILE=FILE profiles the serving process.
func TestLoadCPUPerRequest(t *testing.T) {
	if os.Getenv("GPUSIM_LOAD") == "" {
		t.Skip("set GPUSIM_LOAD=1 to run the load benchmark")
	}
	rate := envInt("GPUSIM_LOAD_RATE", 200)
	seconds := envInt("GPUSIM_LOAD_SECONDS", 20)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(seconds)*time.Second+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestLoadChildServer$")
	cmd.Env = append(os.Environ(), "GPUSIM_LOAD_CHILD=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	out := bufio.NewScanner(stdout)
	readLine := func(prefix string) string {
		for out.Scan() {
			if v, ok := strings.CutPrefix(out.Text(), prefix); ok {
				return v
			}
		}
		t.Fatalf("child exited before printing %q", prefix)
		return ""
	}
	urls := strings.Fields(readLine("urls "))
	cpu := func() time.Duration {
		fmt.Fprintln(stdin, "cpu")
		d, err := time.ParseDuration(readLine("cpu "))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	// Workload: 40 shared 7,000-byte documents, each with a fixed home
	// instance (as a prefix-aware router would send them), plus a unique
	// 1,000-byte question: ~2,000 tokens per prompt, of which ~1,750 can be
	// cached. That keeps each instance's prefill load (~7,000 uncached
	// tokens/s) within its modelled 15,000 tokens/s, so the timings measure
	// the simulator rather than an overloaded model.
	docs := make([]string, 40)
	for i := range docs {
		docs[i] = words(fmt.Sprintf("document %d", i), 7000)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var (
		mu                  sync.Mutex
		ttfts, itls         []time.Duration
		sent, ok, failed    atomic.Int64
		promptTok, cachedTk atomic.Int64
		wg                  sync.WaitGroup
	)
	cpuBefore := cpu()
	start := time.Now()
	total := rate * seconds
	interval := time.Second / time.Duration(rate)
	for i := 0; i < total; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		doc := rand.IntN(len(docs))
		body := chatBody(docs[doc]+words(fmt.Sprintf(" question %d", i), 1000),
			`,"stream":true,"stream_options":{"include_usage":true}`)
		url := urls[doc%len(urls)] + "/v1/chat/completions"
		sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ttft, itl, u, err := streamOnce(ctx, client, url, body)
			if err != nil {
				failed.Add(1)
				return
			}
			ok.Add(1)
			promptTok.Add(int64(u.PromptTokens))
			cachedTk.Add(int64(u.PromptTokensDetails.CachedTokens))
			mu.Lock()
			ttfts = append(ttfts, ttft)
			itls = append(itls, itl)
			mu.Unlock()
		}()
	}
	sendDone := time.Since(start)
	wg.Wait()
	elapsed := time.Since(start)
	cpuUsed := cpu() - cpuBefore

	n := ok.Load()
	if n == 0 {
		t.Fatalf("no request succeeded (%d failed)", failed.Load())
	}
	slices.Sort(ttfts)
	slices.Sort(itls)
	pct := func(s []time.Duration, p float64) time.Duration { return s[int(p*float64(len(s)-1))] }
	t.Logf("sent %d requests in %v (%.1f req/s offered), %d ok, %d failed, all done after %v",
		sent.Load(), sendDone.Round(time.Millisecond), float64(sent.Load())/sendDone.Seconds(), n, failed.Load(), elapsed.Round(time.Millisecond))
	t.Logf("prompt tokens/request %.0f, cached %.1f%%", float64(promptTok.Load())/float64(n), 100*float64(cachedTk.Load())/float64(promptTok.Load()))
	t.Logf("TTFT p50 %v p99 %v; mean inter-token p50 %v p99 %v",
		pct(ttfts, 0.5).Round(time.Millisecond), pct(ttfts, 0.99).Round(time.Millisecond),
		pct(itls, 0.5).Round(100*time.Microsecond), pct(itls, 0.99).Round(100*time.Microsecond))
	t.Logf("simulator CPU: %v over %v = %.1f%% of one core; %.0f us per request",
		cpuUsed.Round(time.Millisecond), elapsed.Round(time.Millisecond),
		100*cpuUsed.Seconds()/elapsed.Seconds(), float64(cpuUsed.Microseconds())/float64(n))
	if failed.Load() > 0 {
		t.Errorf("%d requests failed", failed.Load())
	}
}

// streamOnce sends one streaming request and returns its TTFT (to the
// first content token), its mean inter-token gap and its usage.
func streamOnce(ctx context.Context, c *http.Client, url, body string) (time.Duration, time.Duration, usage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, 0, usage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, usage{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, 0, usage{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	r := bufio.NewReaderSize(resp.Body, 8192)
	var first, last time.Time
	tokens := 0
	var u usage
	done := false
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			if err == io.EOF && done {
				break
			}
			return 0, 0, usage{}, fmt.Errorf("stream: %w (done=%v)", err, done)
		}
		switch {
		case bytes.Contains(line, []byte(`"delta":{"content":"`)):
			now := time.Now()
			_, content, _ := bytes.Cut(line, []byte(`"delta":{"content":"`))
			content, _, _ = bytes.Cut(content, []byte(`"`))
			n := bytes.Count(content, []byte(" ")) // one token per word
			if first.IsZero() {
				first = now
				n++ // the first word has no leading space
			}
			last = now
			tokens += n
		case bytes.Contains(line, []byte(`"usage":`)):
			var c struct{ Usage usage }
			if err := json.Unmarshal(bytes.TrimPrefix(bytes.TrimSpace(line), []byte("data: ")), &c); err != nil {
				return 0, 0, usage{}, err
			}
			u = c.Usage
		case bytes.HasPrefix(line, []byte("data: [DONE]")):
			done = true
		}
	}
	if tokens == 0 || u.CompletionTokens != tokens {
		return 0, 0, usage{}, fmt.Errorf("got %d tokens, usage says %d", tokens, u.CompletionTokens)
	}
	itl := time.Duration(0)
	if tokens > 1 {
		itl = last.Sub(first) / time.Duration(tokens-1)
	}
	return first.Sub(start), itl, u, nil
}

// TestLoadChildServer is the child process of TestLoadCPUPerRequest: it
// serves a 7-instance fleet with the default model, prints its URLs, and
// answers each "cpu" line on stdin with its own CPU time so far.
func TestLoadChildServer(t *testing.T) {
	if os.Getenv("GPUSIM_LOAD_CHILD") == "" {
		t.Skip("run by TestLoadCPUPerRequest")
	}
	if path := os.Getenv("GPUSIM_LOAD_CPUPROFILE"); path != "" {
		pf, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	cfg := DefaultConfig()
	cfg.StreamInterval = envInt("GPUSIM_LOAD_STREAM_INTERVAL", 1)
	f, err := StartFleet(t.Context(), FleetConfig{N: 7, Instance: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Printf("urls %s\n", strings.Join(f.URLs(), " "))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			var ru syscall.Rusage
			if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
				t.Fatal(err)
			}
			d := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			fmt.Printf("cpu %v\n", d)
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
