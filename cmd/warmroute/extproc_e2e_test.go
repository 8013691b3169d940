package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/warmroute/warmroute/loadtest/eppclient"
	"github.com/warmroute/warmroute/loadtest/proc"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The endpoint-picker conformance harness: three `warmroute serve`
// replicas with --ext-proc-listen (TLS, self-signed, as in production)
// driven by loadtest/eppclient the way Envoy drives an InferencePool's
// picker: streamed headers and body, subset hints, served reports, stream
// resets, slow and oversized bodies, and the replicas answering alike.
// The picker does not forward, so the backends are addresses nothing
// listens on, with health probes off.

// pickerReplica is a router serving as endpoint picker.
type pickerReplica struct {
	*router
	ext, health string
	args        proc.ServeArgs
}

// startPickers starts n replicas in a cluster in front of backends, each
// with extra flags, and waits until they agree on one epoch.
func startPickers(t *testing.T, n int, backends []string, extra ...string) []*pickerReplica {
	t.Helper()
	var out []*pickerReplica
	ps := spawnCluster(t, n, proc.ServeArgs{Backends: backends, NoProbes: true}, func(i int, a *proc.ServeArgs) {
		a.GossipListen, a.RaftListen, a.DataDir = freeAddr(t), freeAddr(t), t.TempDir()
		pr := &pickerReplica{ext: freeAddr(t), health: freeAddr(t)}
		a.Extra = append([]string{"--ext-proc-listen", pr.ext, "--ext-proc-health-listen", pr.health}, extra...)
		a.NoEngineMetrics = true
		pr.args = *a
		if i < len(out) {
			out[i] = pr // a second attempt of spawnCluster
		} else {
			out = append(out, pr)
		}
	})
	waitAgreed(t, &http.Client{Timeout: 5 * time.Second}, ps, 30*time.Second)
	for i, p := range ps {
		out[i].router = p
	}
	return out
}

// respawnPicker starts replica p again (its name, data directory, gossip
// and Raft addresses) and waits until it is ready. Its ext-proc and health
// ports were freed when it died, and other tests draw ports from the same
// range: when one was taken meanwhile, it starts again on new ones (twice
// at most).
func respawnPicker(t *testing.T, p *pickerReplica) *router {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := spawnRouter(t, p.args)
		err := r.waitReady()
		if err == nil {
			return r
		}
		if attempt == 3 || !r.portTaken() {
			t.Fatal(err)
		}
		t.Logf("a port was taken meanwhile; starting %s again on new ext-proc ports: %v", p.args.NodeName, err)
		r.Kill()
		p.ext, p.health = freeAddr(t), freeAddr(t)
		extra := slices.Clone(p.args.Extra)
		for i := 0; i+1 < len(extra); i++ {
			switch extra[i] {
			case "--ext-proc-listen":
				extra[i+1] = p.ext
			case "--ext-proc-health-listen":
				extra[i+1] = p.health
			}
		}
		p.args.Extra = extra
	}
}

// pickerBackends returns n loopback backend URLs nothing listens on.
func pickerBackends(t *testing.T, n int) []string {
	var out []string
	for range n {
		out = append(out, "http://"+freeAddr(t))
	}
	return out
}

func dialPicker(t *testing.T, p *pickerReplica) *eppclient.Client {
	t.Helper()
	c, err := eppclient.Dial(p.ext, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pickOnce asks for a decision and ends the exchange with a response from
// the primary.
func pickOnce(ctx context.Context, c *eppclient.Client, req *eppclient.Request) (eppclient.Answer, error) {
	x, err := c.Pick(ctx, req)
	if err != nil {
		return eppclient.Answer{}, err
	}
	a := x.Answer
	if a.Immediate != 0 {
		x.Reset()
		return a, nil
	}
	if len(a.Endpoints) == 0 {
		x.Reset()
		return a, fmt.Errorf("no endpoints and no immediate response: answers %v", a.Kinds)
	}
	_, err = x.Finish(&eppclient.Response{Served: a.Endpoints[0], Status: 200, ContentType: "application/json",
		Body: [][]byte{[]byte(`{"choices":[]}`)}})
	return a, err
}

func chatReq(prompt string) *eppclient.Request {
	return &eppclient.Request{Body: []byte(chatBody(prompt, true)), ChunkSize: 7}
}

// pickerInFlight sums a replica's own and remote in-flight counts.
func pickerInFlight(t *testing.T, p *pickerReplica) (own, remote loads) {
	t.Helper()
	own, remote, err := liveLoads(&http.Client{Timeout: 5 * time.Second}, p.router)
	if err != nil {
		t.Fatal(err)
	}
	return own, remote
}

// metricValue reads one unlabelled series from a router's /metrics.
func metricValue(t *testing.T, r *router, name string) float64 {
	t.Helper()
	resp, err := http.Get(r.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return -1
}

// TestEPPConformance drives every case of the endpoint-picker contract
// against three replicas. It runs alone (not in parallel): its
// goroutine-leak check would see the other tests' goroutines.
func TestEPPConformance(t *testing.T) {
	needCluster(t)
	backends := pickerBackends(t, 4)
	ps := startPickers(t, 3, backends, "--max-body-size", "256KiB", "--max-body-memory", "8MiB",
		"--read-timeout", "1s", "--ext-proc-max-streams", "6")
	// The replicas' processes (and the readers of their output) are
	// there for the whole test; what the cases start must be gone.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	before := goleak.IgnoreCurrent()
	var addrs []string
	for _, b := range backends {
		addrs = append(addrs, strings.TrimPrefix(b, "http://"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialPicker(t, ps[0])
	hc := &http.Client{Timeout: 5 * time.Second}
	baseGoroutines := metricValue(t, ps[0].router, "go_goroutines")

	t.Run("health", func(t *testing.T) {
		for _, p := range ps {
			for _, via := range []struct {
				addr      string
				plaintext bool
			}{{p.ext, false}, {p.health, true}} {
				hcl, err := eppclient.Dial(via.addr, via.plaintext)
				if err != nil {
					t.Fatal(err)
				}
				for _, svc := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "inference-extension", ""} {
					// Readiness follows the router's within a health
					// interval (250 ms).
					var st healthpb.HealthCheckResponse_ServingStatus
					if _, err := pollUntil(5*time.Second, func() (bool, error) {
						var err error
						st, err = hcl.Health(ctx, svc)
						return st == healthpb.HealthCheckResponse_SERVING, err
					}); err != nil {
						t.Errorf("%s via %s: health of %q is %v (%v), want SERVING", p.name, via.addr, svc, st, err)
					}
				}
				hcl.Close()
			}
		}
	})

	t.Run("streamed body: headers, body, trailers in order; header and metadata alike", func(t *testing.T) {
		for _, trailers := range []bool{false, true} {
			body := []byte(chatBody(strings.Repeat("a long shared system prompt ", 150<<10/28)+"and a question", true))
			x, err := c.Pick(ctx, &eppclient.Request{Body: body, ChunkSize: 1000, Trailers: trailers})
			if err != nil {
				t.Fatal(err)
			}
			a := x.Answer
			x.Reset()
			want := []string{"request_headers", "request_body", "request_body", "request_body"}
			if trailers {
				want = append(want, "request_trailers")
			}
			if !slices.Equal(a.Kinds, want) {
				t.Errorf("trailers=%v: answers %v, want %v (62 KiB pieces of a %d-byte body)", trailers, a.Kinds, want, len(body))
			}
			if string(a.Body) != string(body) {
				t.Errorf("trailers=%v: the body passed back differs from the one sent (%d bytes, want %d)", trailers, len(a.Body), len(body))
			}
			if a.Header == "" || a.Header != a.Metadata || !a.ClearRouteCache {
				t.Errorf("header %q, metadata %q, clear_route_cache %v: want the same non-empty value and true", a.Header, a.Metadata, a.ClearRouteCache)
			}
			if len(a.Endpoints) != 3 || len(slices.Compact(slices.Sorted(slices.Values(a.Endpoints)))) != 3 {
				t.Errorf("endpoints %v: want a primary and two distinct fallbacks", a.Endpoints)
			}
			for _, e := range a.Endpoints {
				if !slices.Contains(addrs, e) {
					t.Errorf("endpoint %s is not a backend (%v)", e, addrs)
				}
			}
		}
	})

	t.Run("same decision as the HTTP path", func(t *testing.T) {
		for i := range 20 {
			prompt := fmt.Sprintf("compare the paths %d", i)
			a, err := pickOnce(ctx, c, chatReq(prompt))
			if err != nil {
				t.Fatal(err)
			}
			e, err := explain(hc, ps[0].router, []byte(chatBody(prompt, true)))
			if err != nil {
				t.Fatal(err)
			}
			if e.Backend != a.Endpoints[0] {
				t.Errorf("prompt %d: picker %s, HTTP path %s", i, a.Endpoints[0], e.Backend)
			}
		}
	})

	t.Run("buffered body and no body", func(t *testing.T) {
		a, err := pickOnce(ctx, c, &eppclient.Request{Body: []byte(chatBody("buffered", false)), Mode: filterv3.ProcessingMode_BUFFERED})
		if err != nil || a.Header == "" || a.Header != a.Metadata || !slices.Equal(a.Kinds, []string{"request_headers", "request_body"}) {
			t.Errorf("BUFFERED: answers %v, header %q, metadata %q, err %v", a.Kinds, a.Header, a.Metadata, err)
		}
		a, err = pickOnce(ctx, c, &eppclient.Request{Method: "GET", Path: "/v1/models"})
		if err != nil || len(a.Endpoints) == 0 || !slices.Equal(a.Kinds, []string{"request_headers"}) {
			t.Errorf("GET /v1/models: answers %v, endpoints %v, err %v", a.Kinds, a.Endpoints, err)
		}
		_, err = c.Pick(ctx, &eppclient.Request{Body: []byte(chatBody("streamed mode", false)), Mode: filterv3.ProcessingMode_STREAMED})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("STREAMED body mode: %v, want FailedPrecondition", err)
		}
	})

	t.Run("subset hints", func(t *testing.T) {
		for _, asString := range []bool{false, true} {
			sub := addrs[2:]
			for i := range 20 {
				a, err := pickOnce(ctx, c, &eppclient.Request{Body: []byte(chatBody(fmt.Sprintf("subset %d", i), true)), Subset: sub, SubsetString: asString})
				if err != nil {
					t.Fatal(err)
				}
				if a.Immediate != 0 || len(a.Endpoints) != 2 {
					t.Fatalf("subset %v: endpoints %v, immediate %d", sub, a.Endpoints, a.Immediate)
				}
				for _, e := range a.Endpoints {
					if !slices.Contains(sub, e) {
						t.Errorf("string=%v: endpoint %s outside the subset %v", asString, e, sub)
					}
				}
			}
		}
		for _, sub := range [][]string{{}, {"10.255.0.1:8000"}, {strings.Replace(addrs[0], ":", ":1", 1)}} {
			a, err := pickOnce(ctx, c, &eppclient.Request{Body: []byte(chatBody("nothing fits", true)), Subset: sub})
			if err != nil || a.Immediate != 503 || !strings.Contains(a.ImmediateBody, "no_healthy_backend") {
				t.Errorf("subset %q: immediate %d %s (err %v), want 503", sub, a.Immediate, a.ImmediateBody, err)
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		a, err := pickOnce(ctx, c, &eppclient.Request{Body: []byte(`{"messages":[`)})
		if err != nil || a.Immediate != 400 || !strings.Contains(a.ImmediateBody, `"code":"invalid_`) {
			t.Errorf("truncated JSON: immediate %d %s (err %v), want 400 invalid_*", a.Immediate, a.ImmediateBody, err)
		}
		a, err = pickOnce(ctx, c, &eppclient.Request{Body: []byte(chatBody(strings.Repeat("x", 300<<10), true)), ChunkSize: 16 << 10})
		if err != nil || a.Immediate != 413 {
			t.Errorf("300 KiB body over a 256 KiB limit: immediate %d (err %v), want 413", a.Immediate, err)
		}
		start := time.Now()
		a, err = pickOnce(ctx, c, &eppclient.Request{Body: []byte(chatBody("a slow client", true)), ChunkSize: 20, Gap: 400 * time.Millisecond})
		if err != nil || a.Immediate != 408 {
			t.Errorf("a body trickling past the 1 s read timeout: immediate %d after %v (err %v), want 408", a.Immediate, time.Since(start), err)
		}
	})

	t.Run("served report, gossip and release", func(t *testing.T) {
		x, err := c.Pick(ctx, chatReq("held open"))
		if err != nil {
			t.Fatal(err)
		}
		primary, fallback := x.Answer.Endpoints[0], x.Answer.Endpoints[1]
		waitLoads := func(what string, want loads) {
			t.Helper()
			var own, remote loads
			if _, err := pollUntil(10*time.Second, func() (bool, error) {
				own, _ = pickerInFlight(t, ps[0])
				_, remote = pickerInFlight(t, ps[1])
				return fmt.Sprint(own) == fmt.Sprint(want) && fmt.Sprint(remote) == fmt.Sprint(want), nil
			}); err != nil {
				t.Fatalf("%s: picker's own in-flight %v, another replica's remote %v, want %v", what, own, remote, want)
			}
		}
		waitLoads("after the pick", loads{primary: 1})
		// The primary failed; the gateway retried on the first fallback.
		usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"prompt_tokens_details\":{\"cached_tokens\":750}}}\n\n"
		body, err := x.Finish(&eppclient.Response{Served: fallback, Status: 200, ContentType: "text/event-stream",
			Body: [][]byte{[]byte(usage[:40]), []byte(usage[40:]), []byte("data: [DONE]\n\n")}})
		if err != nil || string(body) != usage+"data: [DONE]\n\n" {
			t.Fatalf("response body passed back %q (err %v)", body, err)
		}
		waitLoads("after the response", loads{})
		// The answer's usage, cut between two pieces, counts for the
		// endpoint that served it.
		cached := fmt.Sprintf(`warmroute_backend_cached_prompt_tokens_total{backend=%q}`, fallback)
		if v := metricValue(t, ps[0].router, cached); v != 750 {
			t.Errorf("%s = %v, want 750", cached, v)
		}

		x, err = c.Pick(ctx, chatReq("reset while held"))
		if err != nil {
			t.Fatal(err)
		}
		waitLoads("held again", loads{x.Answer.Endpoints[0]: 1})
		x.Reset()
		waitLoads("after a reset", loads{})
	})

	// noStreams waits until the picker has no stream open (resets reach
	// it asynchronously).
	noStreams := func(t *testing.T) {
		t.Helper()
		if _, err := pollUntil(10*time.Second, func() (bool, error) {
			return metricValue(t, ps[0].router, "warmroute_extproc_streams") == 0, nil
		}); err != nil {
			t.Fatalf("streams stay open on the picker: %v", err)
		}
	}

	t.Run("shed over the stream cap", func(t *testing.T) {
		noStreams(t)
		var held []*eppclient.Exchange
		for i := range 6 {
			x, err := c.Pick(ctx, chatReq(fmt.Sprintf("held %d", i)))
			if err != nil || x.Answer.Immediate != 0 {
				t.Fatalf("stream %d: %v %+v", i, err, x.Answer)
			}
			held = append(held, x)
		}
		a, err := pickOnce(ctx, c, chatReq("one too many"))
		if err != nil || a.Immediate != 429 {
			t.Errorf("stream over the cap of 6: immediate %d (err %v), want 429", a.Immediate, err)
		}
		for _, x := range held {
			x.Reset()
		}
		// The resets reach the picker asynchronously: the next cases need
		// their slots back.
		noStreams(t)
	})

	t.Run("protocol errors", func(t *testing.T) {
		body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}}
		headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}}
		for name, msgs := range map[string][]*extprocv3.ProcessingRequest{
			"a body before the headers": {body},
			"headers twice":             {headers, headers},
		} {
			s, err := c.Raw(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				if err := s.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v, want InvalidArgument", name, err)
			}
		}
	})

	c.Close()
	hc.CloseIdleConnections()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Nothing of the harness's client side stays behind, and the
	// picker's streams and goroutines go back to where they were.
	if err := goleak.Find(before); err != nil {
		t.Errorf("the harness leaked goroutines: %v", err)
	}
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		return metricValue(t, ps[0].router, "warmroute_extproc_streams") == 0 &&
			metricValue(t, ps[0].router, "go_goroutines") <= baseGoroutines+5, nil
	}); err != nil {
		t.Errorf("picker streams %v, goroutines %v (%v before the cases): %v",
			metricValue(t, ps[0].router, "warmroute_extproc_streams"), metricValue(t, ps[0].router, "go_goroutines"), baseGoroutines, err)
	}
}

// agreement asks every replica in via about the same prompts and returns
// the share of prompts on which they all named the same endpoints.
func pickAgreement(ctx context.Context, t *testing.T, via []*eppclient.Client, prompts []string) (float64, map[string]string) {
	return agreementSettled(ctx, t, via, prompts, nil)
}

// agreementSettled is pickAgreement, calling settle (when not nil) before each
// ask.
func agreementSettled(ctx context.Context, t *testing.T, via []*eppclient.Client, prompts []string, settle func()) (float64, map[string]string) {
	t.Helper()
	same, samePrimary := 0, 0
	first := map[string]string{}
	for i, pr := range prompts {
		var got []string
		// Clients take turns at asking first, as gateways spread over
		// replicas would.
		for k := range via {
			if settle != nil {
				settle()
			}
			c := via[(i+k)%len(via)]
			a, err := pickOnce(ctx, c, chatReq(pr))
			if err != nil {
				t.Fatalf("prompt %d: %v", i, err)
			}
			got = append(got, a.Header)
		}
		if len(slices.Compact(slices.Clone(got))) == 1 {
			same++
		}
		var primaries []string
		for _, h := range got {
			primaries = append(primaries, strings.Split(h, ",")[0])
		}
		if len(slices.Compact(primaries)) == 1 {
			samePrimary++
		}
		first[pr] = got[0]
	}
	primaryAgreement = float64(samePrimary) / float64(len(prompts))
	return float64(same) / float64(len(prompts)), first
}

// primaryAgreement is the share of prompts of the last agreement call on
// which the replicas named the same primary (fallbacks aside).
var primaryAgreement float64

// TestEPPReplicasAgree: three replicas name the same endpoints for the
// same request in steady state, while one is killed, and after it is back.
func TestEPPReplicasAgree(t *testing.T) {
	t.Parallel()
	needCluster(t)
	backends := pickerBackends(t, 8)
	ps := startPickers(t, 3, backends)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var via []*eppclient.Client
	for _, p := range ps {
		via = append(via, dialPicker(t, p))
	}
	var prompts []string
	for i := range 400 {
		prompts = append(prompts, fmt.Sprintf("user %d asks about topic %d", i%37, i))
	}
	share, steady := pickAgreement(ctx, t, via, prompts)
	t.Logf("steady state: %d prompts, replicas agreed on %.2f%%", len(prompts), 100*share)
	if share < 0.999 {
		t.Errorf("steady state: replicas agreed on %.2f%% of prompts, want >= 99.9%%", 100*share)
	}

	ps[2].Kill()
	share, during := pickAgreement(ctx, t, via[:2], prompts)
	changed := 0
	for _, pr := range prompts {
		if during[pr] != steady[pr] {
			changed++
		}
	}
	t.Logf("one replica killed: the other two agreed on %.2f%%; %d decisions differ from before", 100*share, changed)
	if share < 0.999 || changed != 0 {
		t.Errorf("one replica killed: agreement %.2f%% (want >= 99.9%%), %d decisions changed (want 0: the fleet did not)", 100*share, changed)
	}

	r := respawnPicker(t, ps[2])
	ps[2].router = r
	waitAgreed(t, &http.Client{Timeout: 5 * time.Second}, []*router{ps[0].router, ps[1].router, r}, 30*time.Second)
	via[2] = dialPicker(t, ps[2])
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		st, err := via[2].Health(ctx, "readiness")
		return st == healthpb.HealthCheckResponse_SERVING, err
	}); err != nil {
		t.Fatalf("the restarted replica's picker is not ready: %v", err)
	}
	share, after := pickAgreement(ctx, t, via, prompts)
	changed = 0
	for _, pr := range prompts {
		if after[pr] != steady[pr] {
			changed++
		}
	}
	t.Logf("replica restarted: agreement %.2f%%; %d decisions differ from before the kill", 100*share, changed)
	if share < 0.999 || changed != 0 {
		t.Errorf("after the restart: agreement %.2f%% (want >= 99.9%%), %d decisions changed (want 0)", 100*share, changed)
	}
}

// TestEPPStartsWithoutCluster: a router alone serves as picker too, in
// plaintext on loopback, and refuses plaintext elsewhere.
func TestEPPStandalone(t *testing.T) {
	t.Parallel()
	needBinary(t)
	ext := freeAddr(t)
	r := startRouter(t, proc.ServeArgs{Backends: pickerBackends(t, 2), NoProbes: true, NoEngineMetrics: true,
		Extra: []string{"--ext-proc-listen", ext, "--ext-proc-plaintext"}})
	c, err := eppclient.Dial(ext, true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		st, err := c.Health(ctx, "readiness")
		return st == healthpb.HealthCheckResponse_SERVING, err
	}); err != nil {
		t.Fatalf("a lone router's picker is not ready: %v\n%s", err, r.Logs())
	}
	a, err := pickOnce(ctx, c, chatReq("alone"))
	if err != nil || len(a.Endpoints) != 2 {
		t.Fatalf("endpoints %v (err %v), want both backends", a.Endpoints, err)
	}

	_, err = loadServeConfig([]string{"--ext-proc-listen", "0.0.0.0:9002", "--ext-proc-plaintext"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "loopback only") {
		t.Errorf("plaintext on 0.0.0.0: %v, want a refusal", err)
	}
}

// TestEPPReplicasAgreeUnderLoad: with requests held open through one
// replica, enough to put owners at their limit (--concurrency-threshold
// 2), the other replicas learn the load through gossip and every replica
// then makes the same overflow decisions.
func TestEPPReplicasAgreeUnderLoad(t *testing.T) {
	t.Parallel()
	needCluster(t)
	backends := pickerBackends(t, 8)
	ps := startPickers(t, 3, backends, "--concurrency-threshold", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var via []*eppclient.Client
	for _, p := range ps {
		via = append(via, dialPicker(t, p))
	}
	var held []*eppclient.Exchange
	defer func() {
		for _, x := range held {
			x.Reset()
		}
	}()
	for i := range 14 {
		x, err := via[0].Pick(ctx, chatReq(fmt.Sprintf("held open %d", i%5)))
		if err != nil || x.Answer.Immediate != 0 {
			t.Fatalf("held %d: %v %+v", i, err, x.Answer)
		}
		held = append(held, x)
	}
	own, _ := pickerInFlight(t, ps[0])
	for _, p := range ps[1:] {
		var remote loads
		if _, err := pollUntil(10*time.Second, func() (bool, error) {
			_, remote = pickerInFlight(t, p)
			return fmt.Sprint(remote) == fmt.Sprint(own), nil
		}); err != nil {
			t.Fatalf("%s sees %v, replica 0 holds %v", p.name, remote, own)
		}
	}
	var prompts []string
	for i := range 300 {
		// Some prompts of the held ones (whose owners are full), most of
		// others.
		if i%10 == 0 {
			prompts = append(prompts, fmt.Sprintf("held open %d", i/10%5))
		} else {
			prompts = append(prompts, fmt.Sprintf("another prompt %d", i))
		}
	}
	overflowed := 0
	for _, pr := range prompts {
		if e, err := explain(&http.Client{Timeout: 5 * time.Second}, ps[0].router, []byte(chatBody(pr, true))); err == nil && e.Reason != "affinity" {
			overflowed++
		}
	}
	if overflowed == 0 {
		t.Fatalf("no prompt overflows: the test does not exercise load-dependent decisions")
	}
	// Asked back to back, a replica may still count the previous ask's
	// slot, released on another replica less than a publish interval
	// (50 ms) before: near saturation that can change an overflow pick.
	raw, _ := pickAgreement(ctx, t, via, prompts)
	rawPrimary := primaryAgreement

	// Once every replica's view of the load is the same, so is every
	// decision.
	settle := func() {
		if _, err := pollUntil(10*time.Second, func() (bool, error) {
			var views []string
			for _, p := range ps {
				o, r := pickerInFlight(t, p)
				views = append(views, fmt.Sprint(addLoads(o, r)))
			}
			return len(slices.Compact(views)) == 1, nil
		}); err != nil {
			t.Fatalf("the replicas' views of the load never met: %v", err)
		}
	}
	settled, _ := agreementSettled(ctx, t, via, prompts[:100], settle)
	t.Logf("%v held through replica 0 (threshold 2 per backend), %d of %d prompts overflowing: asked back to back the replicas named the same endpoints for %.2f%% (the same primary for %.2f%%); with their load views settled before each ask, the same endpoints for %.2f%% of 100",
		own, overflowed, len(prompts), 100*raw, 100*rawPrimary, 100*settled)
	if settled < 0.999 {
		t.Errorf("with the same view of the load, replicas agreed on %.2f%%, want >= 99.9%%", 100*settled)
	}
}
