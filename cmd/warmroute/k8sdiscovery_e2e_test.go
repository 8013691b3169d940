package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/eppclient"
	"github.com/warmroute/warmroute/loadtest/proc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// kubeAPI is a stub of the two Kubernetes API calls discovery makes: get
// an InferencePool, list the pods of a selector. Its three pods are
// 127.0.0.1-3; ready is how many of them (the first ones) report Ready.
type kubeAPI struct {
	srv      *httptest.Server
	ports    []int
	ready    atomic.Int32
	selector atomic.Pointer[string]
}

func newKubeAPI(t *testing.T, ports []int) *kubeAPI {
	k := &kubeAPI{ports: ports}
	k.ready.Store(2)
	k.srv = httptest.NewServer(http.HandlerFunc(k.serve))
	t.Cleanup(k.srv.Close)
	return k
}

func (k *kubeAPI) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools/llama":
		var tp []map[string]int
		for _, p := range k.ports {
			tp = append(tp, map[string]int{"number": p})
		}
		json.NewEncoder(w).Encode(map[string]any{"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
			"metadata": map[string]any{"name": "llama", "namespace": "llm"},
			"spec":     map[string]any{"selector": map[string]any{"matchLabels": map[string]string{"app": "vllm"}}, "targetPorts": tp}})
	case "/api/v1/namespaces/llm/pods":
		sel := r.URL.Query().Get("labelSelector")
		k.selector.Store(&sel)
		var items []map[string]any
		for i := range 3 {
			ready := "False"
			if i < int(k.ready.Load()) {
				ready = "True"
			}
			items = append(items, map[string]any{
				"metadata": map[string]any{"name": fmt.Sprint("vllm-", i), "namespace": "llm", "labels": map[string]string{"app": "vllm"}},
				"status": map[string]any{"phase": "Running", "podIP": fmt.Sprintf("127.0.0.%d", i+1),
					"conditions": []map[string]string{{"type": "Ready", "status": ready}}},
			})
		}
		json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": "PodList", "metadata": map[string]any{}, "items": items})
	default:
		http.NotFound(w, r)
	}
}

func (k *kubeAPI) kubeconfig(t *testing.T) string {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: stub, cluster: {server: %q}}]
users: [{name: stub, user: {token: stub-token}}]
contexts: [{name: stub, context: {cluster: stub, user: stub, namespace: llm}}]
current-context: stub
`, k.srv.URL)
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEPPKubernetesDiscovery: a router finds an InferencePool's ready pods
// through the Kubernetes API, one backend per pod and target port, commits
// them through Raft, names them as the picker, and drops a pod that stops
// being ready.
func TestEPPKubernetesDiscovery(t *testing.T) {
	t.Parallel()
	needBinary(t)
	k := newKubeAPI(t, []int{18000, 18001})
	ext := freeAddr(t)
	r := startRouterUntil(t, proc.ServeArgs{NoProbes: true, NoEngineMetrics: true, Extra: []string{
		"--ext-proc-listen", ext, "--ext-proc-plaintext",
		"--discovery-k8s-pool", "llama", "--discovery-k8s-namespace", "llm",
		"--discovery-k8s-kubeconfig", k.kubeconfig(t), "--discovery-interval", "200ms"}}, func(r *router) bool {
		return statusContains(r, "127.0.0.2:18001")
	})
	want := []string{"127.0.0.1:18000", "127.0.0.1:18001", "127.0.0.2:18000", "127.0.0.2:18001"}
	ids := func() []string {
		var doc struct {
			Backends []struct {
				ID string `json:"id"`
			} `json:"backends"`
		}
		if err := getJSON(&http.Client{Timeout: 5 * time.Second}, r.admin+"/status", &doc); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range doc.Backends {
			out = append(out, b.ID)
		}
		slices.Sort(out)
		return out
	}
	if got := ids(); !slices.Equal(got, want) {
		t.Fatalf("backends %v, want %v (the ready pods' target ports)", got, want)
	}
	if s := k.selector.Load(); s == nil || *s != "app=vllm" {
		t.Errorf("pods listed with selector %v, want app=vllm", s)
	}
	c, err := eppclient.Dial(ext, true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		st, err := c.Health(ctx, "readiness")
		return st == healthpb.HealthCheckResponse_SERVING, err
	}); err != nil {
		t.Fatal(err)
	}
	a, err := pickOnce(ctx, c, chatReq("discovered"))
	if err != nil || len(a.Endpoints) != 3 || !slices.Contains(want, a.Endpoints[0]) {
		t.Fatalf("picked %v (err %v), want 3 of %v", a.Endpoints, err, want)
	}

	k.ready.Store(1)
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		return !strings.Contains(strings.Join(ids(), ","), "127.0.0.2"), nil
	}); err != nil {
		t.Fatalf("a pod no longer ready stays a backend: %v", ids())
	}
}
