package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/node/cluster"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// PoolResource is the InferencePool API.
var PoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// PodResource is the core pods API. Pods are read with the dynamic client
// too and decoded into corev1.Pod: the typed clientset would compile and
// link every API group's client for one List call.
var PodResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// Bounds on what the API may hand back.
const (
	// MaxPorts is the most target ports a pool has (the API's own bound).
	MaxPorts = 8
	// DefaultMaxEndpoints bounds the endpoints of one source.
	DefaultMaxEndpoints = 4096
)

// Errors.
var (
	ErrTooMany  = errors.New("more endpoints than max-endpoints")
	ErrBadPool  = errors.New("unusable InferencePool")
	ErrNoSource = errors.New("set an InferencePool or a label selector with ports")
)

// Config names the pods.
type Config struct {
	// Namespace of the pool and its pods; empty: this pod's (POD_NAMESPACE
	// or the service account's namespace file).
	Namespace string
	// Pool is an InferencePool's name: its selector and target ports
	// name the endpoints.
	Pool string
	// Selector and Ports name them without a pool.
	Selector string
	Ports    []int
	// Scheme is http or https; Zone and Weight go to every endpoint.
	Scheme string
	Zone   string
	Weight int
	// MaxEndpoints bounds the endpoints (DefaultMaxEndpoints when 0).
	MaxEndpoints int
}

// Validate checks the settings.
func (c *Config) Validate() error {
	switch {
	case c.Pool != "" && c.Selector != "":
		return errors.New("kubernetes discovery: set an InferencePool or a label selector, not both")
	case c.Pool == "" && c.Selector == "":
		return ErrNoSource
	case c.Pool == "" && (len(c.Ports) < 1 || len(c.Ports) > MaxPorts):
		return fmt.Errorf("kubernetes discovery: a label selector needs 1-%d ports, got %d", MaxPorts, len(c.Ports))
	case c.Pool != "" && len(c.Ports) > 0:
		return errors.New("kubernetes discovery: the InferencePool names the ports; drop the ports")
	case c.Scheme != "" && c.Scheme != "http" && c.Scheme != "https":
		return fmt.Errorf("kubernetes discovery: scheme %q, want http or https", c.Scheme)
	case c.MaxEndpoints < 0:
		return errors.New("kubernetes discovery: max endpoints must not be negative")
	}
	for _, p := range c.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("kubernetes discovery: port %d outside [1, 65535]", p)
		}
	}
	if c.Selector != "" {
		if _, err := labels.Parse(c.Selector); err != nil {
			return fmt.Errorf("kubernetes discovery: selector: %w", err)
		}
	}
	return nil
}

// Name describes the source for logs.
func (c *Config) Name() string {
	if c.Pool != "" {
		return "kubernetes inferencepool " + c.Namespace + "/" + c.Pool
	}
	return "kubernetes pods " + c.Namespace + " " + c.Selector
}

// Finder lists the endpoints. It is safe for concurrent use.
type Finder struct {
	cfg Config
	dyn dynamic.Interface
}

var _ cluster.Finder = (*Finder)(nil)

// New returns a finder over the given client.
func New(cfg Config, dyn dynamic.Interface) (*Finder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Namespace == "" {
		cfg.Namespace = ownNamespace()
	}
	if cfg.Scheme == "" {
		cfg.Scheme = "http"
	}
	if cfg.MaxEndpoints == 0 {
		cfg.MaxEndpoints = DefaultMaxEndpoints
	}
	if dyn == nil {
		return nil, errors.New("kubernetes discovery: no client")
	}
	return &Finder{cfg: cfg, dyn: dyn}, nil
}

// Client connects to the API server: in the cluster (the pod's service
// account) when kubeconfig is empty, else with that kubeconfig file.
func Client(kubeconfig string) (dynamic.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: %w", err)
	}
	rc.Timeout = 10 * time.Second
	rc.UserAgent = "warmroute"
	return dynamic.NewForConfig(rc)
}

// serviceAccountNamespace is where a pod finds its namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func ownNamespace() string {
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespace); err == nil && len(b) < 256 {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}

// Find returns the endpoints now, sorted by ID: every target port of
// every running, ready pod with an IP that is not being deleted. A pool
// that does not exist yields none.
func (f *Finder) Find(ctx context.Context) ([]cluster.Backend, error) {
	selector, ports := f.cfg.Selector, f.cfg.Ports
	if f.cfg.Pool != "" {
		var err error
		selector, ports, err = f.readPool(ctx)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	// One pod more than could fit tells a source over the bound.
	limit := int64(f.cfg.MaxEndpoints/len(ports) + 1)
	list, err := f.dyn.Resource(PodResource).Namespace(f.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	if list.GetContinue() != "" || len(list.Items)*len(ports) > f.cfg.MaxEndpoints {
		return nil, fmt.Errorf("%w (%d): pods selected by %q", ErrTooMany, f.cfg.MaxEndpoints, selector)
	}
	var out []cluster.Backend
	for i := range list.Items {
		var p corev1.Pod
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &p); err != nil {
			return nil, fmt.Errorf("listing pods: pod %s: %w", list.Items[i].GetName(), err)
		}
		ip := net.ParseIP(p.Status.PodIP)
		if ip == nil || !podReady(&p) {
			continue
		}
		for _, port := range ports {
			hp := net.JoinHostPort(ip.String(), strconv.Itoa(port))
			out = append(out, cluster.Backend{ID: hp, URL: f.cfg.Scheme + "://" + hp, Zone: f.cfg.Zone, Weight: f.cfg.Weight})
		}
	}
	slices.SortFunc(out, func(a, b cluster.Backend) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(out, func(a, b cluster.Backend) bool { return a.ID == b.ID }), nil
}

// podReady: running, Ready, not being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// readPool reads the pool's selector (spec.selector.matchLabels) and
// target ports (spec.targetPorts[].number), checked.
func (f *Finder) readPool(ctx context.Context) (string, []int, error) {
	u, err := f.dyn.Resource(PoolResource).Namespace(f.cfg.Namespace).Get(ctx, f.cfg.Pool, metav1.GetOptions{})
	if err != nil {
		return "", nil, err
	}
	return poolSelector(u)
}

func poolSelector(u *unstructured.Unstructured) (string, []int, error) {
	match, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil || !found || len(match) == 0 {
		return "", nil, fmt.Errorf("%w %s: spec.selector.matchLabels missing or not a map of strings", ErrBadPool, u.GetName())
	}
	sel, err := labels.ValidatedSelectorFromSet(match)
	if err != nil {
		return "", nil, fmt.Errorf("%w %s: selector: %v", ErrBadPool, u.GetName(), err)
	}
	raw, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil || !found || len(raw) < 1 || len(raw) > MaxPorts {
		return "", nil, fmt.Errorf("%w %s: spec.targetPorts must list 1-%d ports", ErrBadPool, u.GetName(), MaxPorts)
	}
	var ports []int
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return "", nil, fmt.Errorf("%w %s: a target port is not an object", ErrBadPool, u.GetName())
		}
		n, ok := m["number"].(int64)
		if !ok || n < 1 || n > 65535 {
			return "", nil, fmt.Errorf("%w %s: target port %v outside [1, 65535]", ErrBadPool, u.GetName(), m["number"])
		}
		if !slices.Contains(ports, int(n)) {
			ports = append(ports, int(n))
		}
	}
	return sel.String(), ports, nil
}
