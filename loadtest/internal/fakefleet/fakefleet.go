package fleet

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warmroute/warmroute/loadtest/gpusim"
)

// The test binary doubles as the children: with childEnv set it acts as
// `warmroute gpusim` or `warmroute serve` (a round-robin stand-in for the
// router) instead of running tests.
const (
	childEnv     = "FLEET_TEST_CHILD"
	grandPIDFile = "FLEET_TEST_GRANDCHILD_PID"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode, os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func child(mode string, args []string) int {
	if len(args) == 0 {
		return 2
	}
	if mode == "fail" {
		fmt.Fprintln(os.Stderr, "flag provided but not defined: -bogus")
		return 2
	}
	if mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
	}
	fmt.Printf("pid %d\n", os.Getpid())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "gpusim":
		return childGpusim(ctx, mode, args[1:])
	case "serve":
		return childRouter(ctx, mode, args[1:])
	}
	return 2
}

func childGpusim(ctx context.Context, mode string, args []string) int {
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	n := fs.Int("instances", 1, "")
	listen := fs.String("listen", "", "")
	if fs.Parse(args) != nil {
		return 2
	}
	host, port, _ := strings.Cut(*listen, ":")
	var first int
	fmt.Sscan(port, &first)
	cfg := gpusim.DefaultConfig()
	cfg.Overhead, cfg.ITLBase, cfg.ITLPerSeq, cfg.PrefillTokensPerSec = time.Millisecond, time.Millisecond, 0, 1e6
	f, err := gpusim.StartFleet(ctx, gpusim.FleetConfig{N: *n, ListenHost: host, FirstPort: first, Instance: cfg})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	if mode == "grandchild" {
		// a grandchild in the same process group, which Close must also stop
		c := exec.Command("sleep", "120")
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_ = os.WriteFile(os.Getenv(grandPIDFile), []byte(fmt.Sprint(c.Process.Pid)), 0o644)
	}
	fmt.Println("gpusim serving", f.URLs())
	<-ctx.Done()
	if mode == "ignore-term" {
		select {} // only SIGKILL ends this
	}
	return 0
}

func childRouter(ctx context.Context, mode string, args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "", "")
	fs.String("admin-listen", "", "")
	backends := fs.String("backends", "", "")
	strategy := fs.String("strategy", "", "")
	fs.Int("prefix-length", 0, "")
	fs.Int("concurrency-threshold", 0, "")
	fs.Float64("load-factor", 0, "")
	peers := fs.String("peers", "", "")
	if fs.Parse(args) != nil {
		return 2
	}
	var targets []*url.URL
	for _, b := range strings.Split(*backends, ",") {
		u, err := url.Parse(b)
		if err != nil {
			return 2
		}
		targets = append(targets, u)
	}
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			i := next.Add(1) % uint64(len(targets))
			r.SetURL(targets[i])
			r.Out.Header.Set("X-Chosen", targets[i].Host)
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set("X-Warmroute-Backend", resp.Request.Header.Get("X-Chosen"))
			resp.Header.Set("X-Warmroute-Decision", strings.ToLower(*strategy))
			resp.Header.Set("X-Test-Peers", *peers)
			return nil
		},
		FlushInterval: -1,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if mode == "never-ready" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.Handle("/", proxy)
	srv := &http.Server{Addr: *listen, Handler: mux}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
