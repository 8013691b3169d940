package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/eppclient"
	"github.com/warmroute/warmroute/loadtest/fleet"
	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// Measurements of the endpoint picker, for docs/performance.md. They take
// minutes and run only when asked (not with a WARMROUTE_ variable: the
// routers inherit the environment and refuse names that are no setting):
//
//	MEASURE_EPP=1 go test ./cmd/warmroute -run 'TestEPPOverhead|TestEPPRoutingQuality' -v -timeout 30m

func needMeasure(t *testing.T) {
	t.Helper()
	needBinary(t)
	if os.Getenv("MEASURE_EPP") == "" {
		t.Skip("set MEASURE_EPP=1 to measure the endpoint picker")
	}
}

// cpuTicks is a process's user plus system time in clock ticks (1/100 s).
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skip("no /proc:", err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// TestEPPOverhead measures what the picker adds to a request: the time
// from the first request message to the last answer of the request phase
// (a 4 KiB chat body in one piece, as Envoy sends a small body), over TLS
// on loopback, and the router's CPU per decision.
func TestEPPOverhead(t *testing.T) {
	needMeasure(t) // measures: never in parallel
	ext := freeAddr(t)
	r := startRouter(t, proc.ServeArgs{Backends: pickerBackends(t, 8), NoProbes: true, NoEngineMetrics: true,
		Extra: []string{"--ext-proc-listen", ext}})
	ctx := context.Background()
	for _, conc := range []int{1, 8} {
		c, err := eppclient.Dial(ext, false)
		if err != nil {
			t.Fatal(err)
		}
		const n = 20000
		// Warm the connection and the router.
		for i := range 500 {
			if _, err := pickOnce(ctx, c, chatReq(fmt.Sprint("warm ", i))); err != nil {
				t.Fatal(err)
			}
		}
		lat := make([]time.Duration, n)
		startCPU := cpuTicks(t, r.Pid())
		start := time.Now()
		var wg sync.WaitGroup
		var failed int64
		var mu sync.Mutex
		for w := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += conc {
					body := []byte(chatBody(fmt.Sprintf("user %d: %s", i%500, strings.Repeat("context ", 500)), true))
					t0 := time.Now()
					x, err := c.Pick(ctx, &eppclient.Request{Body: body, ChunkSize: 64 << 10})
					lat[i] = time.Since(t0)
					if err != nil || x.Answer.Immediate != 0 {
						mu.Lock()
						failed++
						mu.Unlock()
						if x != nil {
							x.Reset()
						}
						continue
					}
					x.Finish(&eppclient.Response{Served: x.Answer.Endpoints[0], Status: 200, ContentType: "application/json"})
				}
			}()
		}
		wg.Wait()
		wall := time.Since(start)
		cpu := cpuTicks(t, r.Pid()) - startCPU
		c.Close()
		if failed > 0 {
			t.Errorf("%d picks failed", failed)
		}
		t.Logf("concurrency %d: %d requests in %v (%.0f/s); request phase p50 %v p90 %v p99 %v; router CPU %.1f µs per request (whole stream: decision, gRPC, TLS)",
			conc, n, wall.Round(time.Millisecond), float64(n)/wall.Seconds(), percentile(lat, 0.5), percentile(lat, 0.9), percentile(lat, 0.99),
			float64(cpu)*1e4/float64(n))
	}
}

// pickerGateway is a minimal data plane for the quality measurement: it
// reads a request, asks the picker where it goes (as Envoy would over
// ext_proc), forwards it there, streams the answer back and reports the
// served endpoint at the end.
type pickerGateway struct {
	c  *eppclient.Client
	hc *http.Client
}

func (g *pickerGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	h := map[string]string{}
	for k := range r.Header {
		h[strings.ToLower(k)] = r.Header.Get(k)
	}
	x, err := g.c.Pick(r.Context(), &eppclient.Request{Method: r.Method, Path: r.URL.Path, Headers: h, Body: body, ChunkSize: 64 << 10})
	if err != nil {
		http.Error(w, err.Error(), 502)
		return
	}
	defer x.Reset()
	if x.Answer.Immediate != 0 {
		w.WriteHeader(x.Answer.Immediate)
		io.WriteString(w, x.Answer.ImmediateBody)
		return
	}
	ep := x.Answer.Endpoints[0]
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://"+ep+r.URL.RequestURI(), bytes.NewReader(x.Answer.Body))
	req.Header = r.Header.Clone()
	resp, err := g.hc.Do(req)
	if err != nil {
		http.Error(w, err.Error(), 502)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	fl, _ := w.(http.Flusher)
	buf := make([]byte, 16<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
			if fl != nil {
				fl.Flush()
			}
		}
		if err != nil {
			break
		}
	}
	x.Finish(&eppclient.Response{Served: ep, Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type")})
}

// TestEPPRoutingQuality runs demo workloads twice on the demo's fleet
// (seven gpusim instances, cold each time, one PREFIX_AWARE router): once
// through the router's HTTP proxy, once through a gateway that asks the
// same router over ext_proc, and compares the KV hit rates.
func TestEPPRoutingQuality(t *testing.T) {
	needMeasure(t) // measures: never in parallel
	for _, name := range []string{"rag", "chat", "sysprompt"} {
		var hit [2]float64
		var ttft [2]float64
		for i, via := range []string{"http", "picker"} {
			ext := freeAddr(t)
			fc := fleet.DefaultConfig()
			fc.Exe = binPath
			fc.Instances = 7
			fc.GpusimArgs = proc.GpusimArgs{KVBlocks: 6000}.Flags()
			fc.RouterArgs = func(_ int, _ []fleet.Router, a *proc.ServeArgs) error {
				a.Extra = append(a.Extra, "--ext-proc-listen", ext, "--ext-proc-plaintext")
				return nil
			}
			ctx := context.Background()
			f, err := fleet.Start(ctx, fc)
			if err != nil {
				t.Fatal(err)
			}
			c, err := demoCase(name, 1, 15*time.Second, 40*time.Second, 1)
			if err != nil {
				t.Fatal(err)
			}
			lc := c.Load
			lc.MetricsURLs, lc.Backends = f.MetricsURLs(), f.BackendIDs()
			lc.Bounds.Instances, lc.Bounds.KVBlocks = 7, 6000
			lc.Targets = f.Targets()
			var gw *http.Server
			if via == "picker" {
				pc, err := eppclient.Dial(ext, true)
				if err != nil {
					t.Fatal(err)
				}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				gw = &http.Server{Handler: &pickerGateway{c: pc, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}}}
				go gw.Serve(ln)
				lc.Targets = []string{"http://" + ln.Addr().String()}
				defer pc.Close()
			}
			w := c.Workload
			ids, err := loadtest.Models(ctx, f.Targets()[0])
			if err != nil || len(ids) == 0 {
				t.Fatal(err)
			}
			w.Model = ids[0]
			gen, err := workload.New(w)
			if err != nil {
				t.Fatal(err)
			}
			sum, err := loadtest.Run(ctx, lc, gen)
			if gw != nil {
				gw.Close()
			}
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			if sum.KV == nil {
				t.Fatal("no hit rate")
			}
			hit[i], ttft[i] = sum.KV.HitRate, sum.TTFT.P50Ms
			t.Logf("%s via %s: %d requests, %d failed, KV hit rate %.1f%%, TTFT p50 %.0f ms p99 %.0f ms, share max/min %.2f",
				name, via, sum.Requests, sum.Failed, 100*sum.KV.HitRate, sum.TTFT.P50Ms, sum.TTFT.P99Ms, sum.ShareMaxMin)
		}
		t.Logf("%s: hit rate HTTP %.1f%%, picker %.1f%% (difference %.1f points); TTFT p50 %.0f ms and %.0f ms", name, 100*hit[0], 100*hit[1], 100*(hit[1]-hit[0]), ttft[0], ttft[1])
	}
}
