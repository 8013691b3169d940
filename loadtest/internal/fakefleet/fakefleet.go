package fakefleet

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
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
	"golang.org/x/net/netutil"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/loadtest/gpusim"
)

// Environment variables read by TestMain and the children.
const (
	// Env selects the behaviour: "ok", "fail" (exit at once with a flag
	// error), "ignore-term" (ignore SIGTERM), "grandchild" (gpusim starts a
	// `sleep` in its process group), "never-ready" (the router's /readyz
	// answers 503), "sim" (gpusim flags are those of the real model rather
	// than a fast one).
	Env = "FAKEFLEET_MODE"
	// GrandchildPIDFile names the file the grandchild's pid is written to.
	GrandchildPIDFile = "FAKEFLEET_GRANDCHILD_PID"
)

// TestMain is the TestMain of a test binary that doubles as the children:
// it runs the child its arguments name when the Env variable is set, and
// m's tests, checked for leaked goroutines, when it is not.
func TestMain(m *testing.M) {
	if os.Getenv(Env) != "" {
		os.Exit(child(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// child runs the child named by args[0] ("gpusim" or "serve") and returns
// its exit code. It prints "pid N" first so tests can check it is gone.
func child(args []string) int {
	mode := os.Getenv(Env)
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
		return gpusimMain(ctx, mode, args[1:])
	case "serve":
		return routerMain(ctx, mode, args[1:])
	}
	return 2
}

func gpusimMain(ctx context.Context, mode string, args []string) int {
	cfg := gpusim.FastConfig()
	if mode == "sim" {
		cfg = gpusim.DefaultConfig()
	}
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	n := fs.Int("instances", 1, "")
	listen := fs.String("listen", "", "")
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	host, port, _ := strings.Cut(*listen, ":")
	var first int
	fmt.Sscan(port, &first)
	f, err := gpusim.StartFleet(ctx, gpusim.FleetConfig{N: *n, ListenHost: host, FirstPort: first, Instance: cfg})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	if mode == "grandchild" {
		c := exec.Command("sleep", "120")
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_ = os.WriteFile(os.Getenv(GrandchildPIDFile), []byte(fmt.Sprint(c.Process.Pid)), 0o644)
	}
	fmt.Println("gpusim serving", f.URLs())
	<-ctx.Done()
	if mode == "ignore-term" {
		select {} // only SIGKILL ends this
	}
	return 0
}

type backend struct {
	url      *url.URL
	id       string
	inFlight atomic.Int64
}

type router struct {
	backends  []*backend
	strategy  string
	prefixLen int
	threshold int64
	rr        atomic.Uint64
}

type ctxKey struct{}

func (rt *router) pick(body []byte) (*backend, string) {
	n := len(rt.backends)
	least := func() *backend {
		best := rt.backends[0]
		for _, b := range rt.backends[1:] {
			if b.inFlight.Load() < best.inFlight.Load() {
				best = b
			}
		}
		return best
	}
	switch rt.strategy {
	case "ROUND_ROBIN":
		return rt.backends[rt.rr.Add(1)%uint64(n)], "round_robin"
	case "LEAST_OUTSTANDING_REQUESTS":
		return least(), "least_outstanding"
	case "PREFIX_AWARE", "CONSISTENT_HASH":
		key := body
		if i := bytes.Index(key, []byte(`"messages":`)); i >= 0 {
			key = key[i:]
		} else if i := bytes.Index(key, []byte(`"prompt":`)); i >= 0 {
			key = key[i:]
		}
		if len(key) > rt.prefixLen {
			key = key[:rt.prefixLen]
		}
		h := fnv.New64a()
		h.Write(key)
		owner := rt.backends[h.Sum64()%uint64(n)]
		if rt.strategy == "CONSISTENT_HASH" {
			return owner, "consistent_hash"
		}
		if owner.inFlight.Load() < rt.threshold {
			return owner, "affinity"
		}
		if l := least(); l.inFlight.Load() < rt.threshold {
			return l, "overflow"
		}
		return least(), "fallback"
	default:
		return rt.backends[rand.IntN(n)], "random"
	}
}

func routerMain(ctx context.Context, mode string, args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "", "")
	admin := fs.String("admin-listen", "", "")
	backends := fs.String("backends", "", "")
	strategy := fs.String("strategy", "RANDOM", "")
	prefixLen := fs.Int("prefix-length", 1024, "")
	threshold := fs.Int("concurrency-threshold", 8, "")
	fs.Float64("load-factor", 0, "")
	fs.String("peers", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rt := &router{strategy: *strategy, prefixLen: *prefixLen, threshold: int64(*threshold)}
	for _, b := range strings.Split(*backends, ",") {
		// [id=]url, parsed as warmroute serve parses it.
		spec, err := backendspec.Parse(b)
		if err != nil {
			return 2
		}
		u, err := url.Parse(spec.URL)
		if err != nil {
			return 2
		}
		id := spec.ID
		if id == "" {
			id = u.Host
		}
		rt.backends = append(rt.backends, &backend{url: u, id: id})
	}
	// The fake's listeners are bounded like any: connections, header time
	// and size, idle time and body size (no write timeout: it streams).
	const (
		maxConns      = 4096
		maxBody       = 64 << 20
		headerTimeout = 10 * time.Second
		idleTimeout   = time.Minute
	)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			b := r.In.Context().Value(ctxKey{}).(*backend)
			r.SetURL(b.url)
		},
		FlushInterval: -1,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if mode == "never-ready" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		b, decision := rt.pick(body)
		b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
		r.Body = io.NopCloser(bytes.NewReader(body))
		w.Header().Set("X-Warmroute-Backend", b.id)
		w.Header().Set("X-Warmroute-Decision", decision)
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, b)))
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln = netutil.LimitListener(ln, maxConns)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: 64 << 10}
	var adminSrv *http.Server
	if *admin != "" {
		aln, err := net.Listen("tcp", *admin)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		aln = netutil.LimitListener(aln, maxConns)
		adminSrv = &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: 64 << 10}
		go func() { _ = adminSrv.Serve(aln) }()
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		if adminSrv != nil {
			_ = adminSrv.Close()
		}
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
