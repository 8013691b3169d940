package node

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/node/kube"
)

// PortList is a comma-separated list of ports ("8000,8001").
type PortList []int

// UnmarshalText parses "8000,8001".
func (p *PortList) UnmarshalText(b []byte) error {
	var out PortList
	for _, f := range strings.Split(string(b), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q: want a number in [1, 65535]", f)
		}
		out = append(out, n)
	}
	if len(out) > kube.MaxPorts {
		return fmt.Errorf("%d ports, at most %d", len(out), kube.MaxPorts)
	}
	*p = out
	return nil
}

// MarshalText renders the list.
func (p PortList) MarshalText() ([]byte, error) {
	var parts []string
	for _, n := range p {
		parts = append(parts, strconv.Itoa(n))
	}
	return []byte(strings.Join(parts, ",")), nil
}

// k8sEnabled says whether Kubernetes discovery is configured.
func (cl *ClusterConfig) k8sEnabled() bool {
	return cl.DiscoveryK8sPool != "" || cl.DiscoveryK8sSelector != ""
}

func (cl *ClusterConfig) k8sConfig() kube.Config {
	return kube.Config{Namespace: cl.DiscoveryK8sNamespace, Pool: cl.DiscoveryK8sPool, Selector: cl.DiscoveryK8sSelector,
		Ports: cl.DiscoveryK8sPorts, Zone: cl.Zone}
}

func (cl *ClusterConfig) validateK8s() []error {
	if !cl.k8sEnabled() {
		if len(cl.DiscoveryK8sPorts) > 0 || cl.DiscoveryK8sNamespace != "" || cl.DiscoveryK8sKubeconfig != "" {
			return []error{errors.New("discovery-k8s-ports, -namespace and -kubeconfig need discovery-k8s-pool or discovery-k8s-selector")}
		}
		return nil
	}
	var errs []error
	if cl.DiscoveryDNS != "" {
		errs = append(errs, errors.New("discovery-dns and Kubernetes discovery are exclusive: set one"))
	}
	kc := cl.k8sConfig()
	if err := kc.Validate(); err != nil {
		errs = append(errs, err)
	}
	if cl.DiscoveryInterval <= 0 {
		errs = append(errs, errors.New("discovery-interval must be positive"))
	}
	return errs
}

// k8sDiscovery sets d up to find backends in Kubernetes, when configured.
func (cl *ClusterConfig) k8sDiscovery(d *cluster.DiscoveryConfig) error {
	if !cl.k8sEnabled() {
		return nil
	}
	dyn, err := kube.Client(cl.DiscoveryK8sKubeconfig)
	if err != nil {
		return err
	}
	f, err := kube.New(cl.k8sConfig(), dyn)
	if err != nil {
		return err
	}
	kc := cl.k8sConfig()
	d.Name, d.Finder, d.Interval, d.Zone = kc.Name(), f, cl.DiscoveryInterval, cl.Zone
	return nil
}
