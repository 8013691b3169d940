package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/loadtest/workload"
)

// Response headers the load reads.
const (
	headerBackend  = "X-Warmroute-Backend"
	headerDecision = "X-Warmroute-Decision"
	headerEpoch    = "X-Warmroute-Epoch"
)

// rotation is the set of routers an L4 load balancer would send new
// requests to, taken in turn.
type rotation struct {
	mu      sync.Mutex
	routers []Router
	in      map[string]bool
	next    int
}

func newRotation(rs []Router) *rotation {
	r := &rotation{routers: append([]Router(nil), rs...), in: map[string]bool{}}
	for _, x := range rs {
		r.in[x.Name] = true
	}
	return r
}

// set puts a router in or out of rotation.
func (r *rotation) set(name string, in bool) {
	r.mu.Lock()
	r.in[name] = in
	r.mu.Unlock()
}

// setAll puts every router in or out.
func (r *rotation) setAll(in bool) {
	r.mu.Lock()
	for _, x := range r.routers {
		r.in[x.Name] = in
	}
	r.mu.Unlock()
}

// order returns the routers in rotation, starting with the next one in turn.
func (r *rotation) order() []Router {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.routers)
	out := make([]Router, 0, n)
	for i := 0; i < n; i++ {
		x := r.routers[(r.next+i)%n]
		if r.in[x.Name] {
			out = append(out, x)
		}
	}
	r.next = (r.next + 1) % max(n, 1)
	return out
}

// loader sends the steady load and records every request.
type loader struct {
	cfg    *Config
	gen    workload.Generator
	rot    *rotation
	client *http.Client
	t0     time.Time

	mu   sync.Mutex
	recs []Record
}

func newLoader(cfg *Config, gen workload.Generator, rot *rotation, t0 time.Time) *loader {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &loader{cfg: cfg, gen: gen, rot: rot, client: &http.Client{Transport: tr}, t0: t0}
}

// records returns a copy of the records so far.
func (l *loader) records() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Record(nil), l.recs...)
}

// Run sends requests until ctx ends, then waits for those in flight (each
// bounded by the request timeout).
func (l *loader) Run(ctx context.Context) {
	defer l.client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(l.cfg.Seed, 0x63686173))
	sem := make(chan struct{}, l.cfg.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	next := time.Now()
	var req workload.Request
	for seq := 0; ; seq++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / l.cfg.Rate * float64(time.Second)))
		if d := time.Until(next); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		l.gen.Next(&req)
		body := append([]byte(nil), req.Body...)
		path := req.Path
		wg.Add(1)
		go func(seq int) {
			defer wg.Done()
			defer func() { <-sem }()
			rec := l.send(body, path, seq)
			l.mu.Lock()
			l.recs = append(l.recs, rec)
			l.mu.Unlock()
		}(seq)
	}
}

func (l *loader) since() time.Duration { return time.Since(l.t0) }

// send issues one request to the next router in rotation, moving on to the
// following one only when the connection was refused (nothing was sent).
func (l *loader) send(body []byte, path string, seq int) Record {
	rec := Record{Seq: seq, Start: l.since()}
	order := l.rot.order()
	if len(order) == 0 {
		rec.End, rec.Err = rec.Start, "no_router"
		return rec
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RequestTimeout)
	defer cancel()
	for i, r := range order {
		rec.Router = r.Name
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+path, bytes.NewReader(body))
		if err != nil {
			rec.Err = "request"
			break
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := l.client.Do(req)
		if err != nil {
			if isDialError(err) && i < len(order)-1 {
				rec.Redispatched = true
				continue
			}
			rec.Err = errKind(err, ctx)
			break
		}
		l.read(resp, ctx, &rec)
		break
	}
	rec.End = l.since()
	return rec
}

// read consumes a response into rec.
func (l *loader) read(resp *http.Response, ctx context.Context, rec *Record) {
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.Backend = resp.Header.Get(headerBackend)
	rec.Decision = resp.Header.Get(headerDecision)
	if e, err := strconv.ParseUint(resp.Header.Get(headerEpoch), 10, 64); err == nil {
		rec.Epoch = e
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		rec.Err = "http_" + strconv.Itoa(resp.StatusCode)
		if rec.Backend == "" {
			rec.Backend = ErrorBackend(b)
		}
		rec.Detail = errorMessage(b)
		return
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			rec.Err = errKind(err, ctx)
		}
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	done := false
	for sc.Scan() {
		if bytes.Equal(bytes.TrimSpace(sc.Bytes()), []byte("data: [DONE]")) {
			done = true
		}
	}
	switch {
	case sc.Err() != nil:
		rec.Err = errKind(sc.Err(), ctx)
	case !done:
		rec.Err = "incomplete"
	}
}

// isDialError reports a failure to connect: nothing reached the router.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// errKind names a transport failure.
func errKind(err error, ctx context.Context) string {
	var op *net.OpError
	switch {
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.As(err, &op) && op.Op == "dial":
		return "connect"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "eof"
	}
	return "transport"
}

// ErrorBackend extracts the backend id from a router's error body
// ("backend X failed: ..." or "backend X did not answer in time"), "" when
// it names none.
func ErrorBackend(body []byte) string {
	rest, ok := strings.CutPrefix(errorMessage(body), "backend ")
	if !ok {
		return ""
	}
	for _, end := range []string{" failed", " did not answer"} {
		if i := strings.Index(rest, end); i > 0 {
			id := rest[:i]
			if strings.ContainsAny(id, " \t\n") {
				return ""
			}
			return id
		}
	}
	return ""
}

// errorMessage is the message of an OpenAI-style error body, at most 200
// bytes of it, or "".
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	m := e.Error.Message
	if len(m) > 200 {
		m = strings.ToValidUTF8(m[:200], "")
	}
	return m
}

// String is a short description for progress lines.
func (r Record) String() string {
	return fmt.Sprintf("#%d %s %s->%s %d %s", r.Seq, r.Router, r.Decision, r.Backend, r.Status, r.Err)
}
