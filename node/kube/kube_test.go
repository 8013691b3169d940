package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/warmroute/warmroute/node/cluster"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
)

func pod(name, ip string, ready bool, lbl map[string]string, mut ...func(*corev1.Pod)) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: lbl},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

func pool(name string, match map[string]any, ports ...any) *unstructured.Unstructured {
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": p})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name, "namespace": "llm"},
		"spec":     map[string]any{"selector": map[string]any{"matchLabels": match}, "targetPorts": tp},
	}}
}

// dyn is a fake API server holding objs: pods (typed) and pools
// (unstructured).
func dyn(t *testing.T, objs ...runtime.Object) *dynfake.FakeDynamicClient {
	t.Helper()
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(s,
		map[schema.GroupVersionResource]string{PoolResource: "InferencePoolList", PodResource: "PodList"}, objs...)
}

func ids(bs []cluster.Backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

func TestFindPool(t *testing.T) {
	vllm := map[string]string{"app": "vllm"}
	pods := []runtime.Object{
		pod("a", "10.1.0.1", true, vllm),
		pod("b", "10.1.0.2", true, vllm),
		pod("not-ready", "10.1.0.3", false, vllm),
		pod("no-ip", "", true, vllm),
		pod("deleting", "10.1.0.4", true, vllm, func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }),
		pod("pending", "10.1.0.5", true, vllm, func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
		pod("other-app", "10.1.0.6", true, map[string]string{"app": "other"}),
		pod("v6", "fd00::7", true, vllm),
	}
	f, err := New(Config{Namespace: "llm", Pool: "llama"}, dyn(t, append(pods, pool("llama", map[string]any{"app": "vllm"}, int64(8000), int64(8001)))...))
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Find(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.1.0.1:8000", "10.1.0.1:8001", "10.1.0.2:8000", "10.1.0.2:8001", "[fd00::7]:8000", "[fd00::7]:8001"}
	if !slices.Equal(ids(got), want) {
		t.Fatalf("endpoints %v, want %v", ids(got), want)
	}
	if got[0].URL != "http://10.1.0.1:8000" {
		t.Errorf("URL %q", got[0].URL)
	}

	// A pool that is gone names no endpoints; a broken one is an error.
	f, _ = New(Config{Namespace: "llm", Pool: "gone"}, dyn(t, pods...))
	if got, err := f.Find(context.Background()); err != nil || len(got) != 0 {
		t.Errorf("missing pool: %v %v, want none and no error", ids(got), err)
	}
	for name, p := range map[string]*unstructured.Unstructured{
		"no ports":    pool("bad", map[string]any{"app": "vllm"}),
		"nine ports":  pool("bad", map[string]any{"app": "vllm"}, int64(1), int64(2), int64(3), int64(4), int64(5), int64(6), int64(7), int64(8), int64(9)),
		"port 0":      pool("bad", map[string]any{"app": "vllm"}, int64(0)),
		"port string": pool("bad", map[string]any{"app": "vllm"}, "http"),
		"no selector": pool("bad", map[string]any{}, int64(8000)),
		"bad label":   pool("bad", map[string]any{"app": "a b"}, int64(8000)),
	} {
		f, _ := New(Config{Namespace: "llm", Pool: "bad"}, dyn(t, append(slices.Clone(pods), p)...))
		if _, err := f.Find(context.Background()); !errors.Is(err, ErrBadPool) {
			t.Errorf("%s: %v, want ErrBadPool", name, err)
		}
	}
}

func TestFindSelectorBounded(t *testing.T) {
	var objs []runtime.Object
	for i := range 10 {
		objs = append(objs, pod(fmt.Sprint("p", i), fmt.Sprintf("10.2.0.%d", i+1), true, map[string]string{"app": "x"}))
	}
	pods := dyn(t, objs...)
	f, err := New(Config{Namespace: "llm", Selector: "app=x", Ports: []int{9000}, MaxEndpoints: 10}, pods)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := f.Find(context.Background()); err != nil || len(got) != 10 {
		t.Fatalf("%d endpoints (%v), want 10", len(got), err)
	}
	f, _ = New(Config{Namespace: "llm", Selector: "app=x", Ports: []int{9000, 9001}, MaxEndpoints: 10}, pods)
	if _, err := f.Find(context.Background()); !errors.Is(err, ErrTooMany) {
		t.Fatalf("20 endpoints over a bound of 10: %v, want ErrTooMany", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]Config{
		"neither":        {},
		"both":           {Pool: "p", Selector: "a=b", Ports: []int{1}},
		"selector ports": {Selector: "a=b"},
		"nine ports":     {Selector: "a=b", Ports: []int{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		"pool ports":     {Pool: "p", Ports: []int{1}},
		"bad selector":   {Selector: "a b c", Ports: []int{1}},
		"bad port":       {Selector: "a=b", Ports: []int{70000}},
		"bad scheme":     {Pool: "p", Scheme: "ftp"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
