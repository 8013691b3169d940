package deploy

import (
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
)

const k8sDir = "k8s"

// manifests is the decoded content of deploy/k8s.
type manifests struct {
	namespaces      []*corev1.Namespace
	serviceAccounts []*corev1.ServiceAccount
	configMaps      []*corev1.ConfigMap
	services        []*corev1.Service
	statefulSets    []*appsv1.StatefulSet
	deployments     []*appsv1.Deployment
	pdbs            []*policyv1.PodDisruptionBudget
	netpols         []*networkingv1.NetworkPolicy
}

// decodeStrict decodes one YAML document the way the API server's strict
// field validation does: duplicate keys, unknown fields (matched case
// sensitively) and type mismatches are errors.
func decodeStrict(doc []byte) (any, error) {
	js, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, &tm); err != nil {
		return nil, err
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "v1/Namespace":
		obj = &corev1.Namespace{}
	case "v1/ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "apps/v1/StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	default:
		return nil, fmt.Errorf("apiVersion %q kind %q: not a kind these manifests should use", tm.APIVersion, tm.Kind)
	}
	strict, err := sigsjson.UnmarshalStrict(js, obj)
	if err != nil {
		return nil, err
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("%s %s", tm.Kind, strings.Join(msgs, "; "))
	}
	return obj, nil
}

func (m *manifests) add(obj any) {
	switch o := obj.(type) {
	case *corev1.Namespace:
		m.namespaces = append(m.namespaces, o)
	case *corev1.ServiceAccount:
		m.serviceAccounts = append(m.serviceAccounts, o)
	case *corev1.ConfigMap:
		m.configMaps = append(m.configMaps, o)
	case *corev1.Service:
		m.services = append(m.services, o)
	case *appsv1.StatefulSet:
		m.statefulSets = append(m.statefulSets, o)
	case *appsv1.Deployment:
		m.deployments = append(m.deployments, o)
	case *policyv1.PodDisruptionBudget:
		m.pdbs = append(m.pdbs, o)
	case *networkingv1.NetworkPolicy:
		m.netpols = append(m.netpols, o)
	}
}

// kustomizeFiles returns the resources kustomization.yaml lists.
func kustomizeFiles(t *testing.T) []string {
	t.Helper()
	var k struct {
		Resources []string `json:"resources"`
		Images    []struct {
			Name   string `json:"name"`
			NewTag string `json:"newTag"`
		} `json:"images"`
	}
	if err := sigsyaml.Unmarshal(readFile(t, filepath.Join(k8sDir, "kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	return k.Resources
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files := kustomizeFiles(t)
	onDisk, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range onDisk {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	got := slices.Clone(files)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml resources %v, files on disk %v", got, want)
	}
	m := &manifests{}
	for _, f := range files {
		for i, doc := range yamlDocs(t, filepath.Join(k8sDir, f)) {
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Errorf("%s document %d: %v", f, i+1, err)
				continue
			}
			m.add(obj)
		}
	}
	return m
}

// TestStrictDecodingCatchesMistakes shows the validator fails on the
// mistakes it is there to catch.
func TestStrictDecodingCatchesMistakes(t *testing.T) {
	good := "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n"
	if _, err := decodeStrict([]byte(good)); err != nil {
		t.Fatalf("valid Service rejected: %v", err)
	}
	bad := map[string]string{
		"unknown field":   "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  publishNotReady: true\n",
		"wrong case":      "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ClusterIP: None\n",
		"duplicate key":   "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n  name: y\n",
		"wrong type":      "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: eighty\n",
		"bad quantity":    "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          resources:\n            requests:\n              memory: 256MB-ish\n",
		"misplaced field": "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          containerPorts:\n            - containerPort: 80\n",
		"unknown kind":    "apiVersion: apps/v1\nkind: StatefullSet\nmetadata:\n  name: x\n",
	}
	for name, doc := range bad {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestKubernetesManifests decodes every manifest strictly and checks the
// objects against each other.
func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	if t.Failed() {
		t.FailNow()
	}
	for _, err := range m.validate() {
		t.Error(err)
	}
}

// TestManifestChecksCatchMistakes breaks valid manifests in ways strict
// decoding cannot see and expects the cross-object checks to notice.
func TestManifestChecksCatchMistakes(t *testing.T) {
	breakers := map[string]func(m *manifests){
		"selector does not match template": func(m *manifests) {
			m.router().Spec.Template.Labels["app.kubernetes.io/component"] = "other"
		},
		"probe names a missing port": func(m *manifests) {
			m.routerContainer().ReadinessProbe.HTTPGet.Port = intstr.FromString("htttp")
		},
		"volume mount without volume": func(m *manifests) {
			m.router().Spec.VolumeClaimTemplates[0].Name = "raft"
		},
		"service without matching pods": func(m *manifests) {
			m.service("warmroute").Spec.Selector["app.kubernetes.io/name"] = "warmrouter"
		},
		"ordered pod management": func(m *manifests) {
			m.router().Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
		},
		"no zone spread": func(m *manifests) {
			m.router().Spec.Template.Spec.TopologySpreadConstraints = nil
		},
		"root container": func(m *manifests) {
			m.router().Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil
			m.routerContainer().SecurityContext.AllowPrivilegeEscalation = nil
		},
		"request above limit": func(m *manifests) {
			m.routerContainer().Resources.Requests[corev1.ResourceMemory] = resource.MustParse("2Gi")
		},
		"env reference before definition": func(m *manifests) {
			c := m.routerContainer()
			c.Env = append([]corev1.EnvVar{{Name: "EARLY", Value: "$(POD_IP)"}}, c.Env...)
		},
		"peers not published before ready": func(m *manifests) {
			m.service("warmroute-peers").Spec.PublishNotReadyAddresses = false
		},
		"budget blocks every drain": func(m *manifests) {
			v := intstr.FromInt32(3)
			m.pdbs[0].Spec.MinAvailable = &v
		},
		"cluster TLS off": func(m *manifests) {
			c := m.routerContainer()
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "WARMROUTE_CLUSTER_TLS_KEY_FILE" })
		},
		"insecure cluster allowed": func(m *manifests) {
			c := m.routerContainer()
			c.Env = append(c.Env, corev1.EnvVar{Name: "WARMROUTE_ALLOW_INSECURE_CLUSTER", Value: "true"})
		},
		"one certificate for every pod": func(m *manifests) {
			for i, e := range m.routerContainer().Env {
				if e.Name == "WARMROUTE_CLUSTER_TLS_CERT_FILE" {
					m.routerContainer().Env[i].Value = "/run/secrets/warmroute-tls/warmroute-0.pem"
				}
			}
		},
		"certificates not from a Secret": func(m *manifests) {
			for i, v := range m.router().Spec.Template.Spec.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "warmroute-tls" {
					m.router().Spec.Template.Spec.Volumes[i].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
				}
			}
		},
		"network policy names a missing port": func(m *manifests) {
			p := intstr.FromString("metrics")
			m.netpols[0].Spec.Ingress[2].Ports[0].Port = &p
		},
	}
	checkBreakers(t, loadManifests, breakers)
}

func (m *manifests) router() *appsv1.StatefulSet {
	for _, s := range m.statefulSets {
		if s.Name == "warmroute" {
			return s
		}
	}
	return nil
}

func (m *manifests) routerContainer() *corev1.Container {
	return &m.router().Spec.Template.Spec.Containers[0]
}

func (m *manifests) service(name string) *corev1.Service {
	for _, s := range m.services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// workload is a pod template with its owner's name.
type workload struct {
	kind, name string
	replicas   int32
	selector   *metav1.LabelSelector
	template   *corev1.PodTemplateSpec
	claims     []corev1.PersistentVolumeClaim
}

func (m *manifests) workloads() []workload {
	var out []workload
	for _, s := range m.statefulSets {
		out = append(out, workload{"StatefulSet", s.Name, replicas(s.Spec.Replicas), s.Spec.Selector, &s.Spec.Template, s.Spec.VolumeClaimTemplates})
	}
	for _, d := range m.deployments {
		out = append(out, workload{"Deployment", d.Name, replicas(d.Spec.Replicas), d.Spec.Selector, &d.Spec.Template, nil})
	}
	return out
}

func replicas(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// podsMatching returns the workloads whose pods a selector selects.
func (m *manifests) podsMatching(sel labels.Selector) []workload {
	var out []workload
	for _, w := range m.workloads() {
		if sel.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// containerPort finds a named or numbered port with a protocol on any
// container of the workload.
func containerPort(w workload, port intstr.IntOrString, proto corev1.Protocol) bool {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, c := range w.template.Spec.Containers {
		for _, p := range c.Ports {
			pp := p.Protocol
			if pp == "" {
				pp = corev1.ProtocolTCP
			}
			if pp != proto {
				continue
			}
			if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
				return true
			}
		}
	}
	return false
}

func (m *manifests) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	names := func(kind, name string, labelsMap map[string]string) {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			bad("%s %q: name: %s", kind, name, msg)
		}
		for k, v := range labelsMap {
			for _, msg := range validation.IsQualifiedName(k) {
				bad("%s %q: label key %q: %s", kind, name, k, msg)
			}
			for _, msg := range validation.IsValidLabelValue(v) {
				bad("%s %q: label %q value %q: %s", kind, name, k, v, msg)
			}
		}
	}
	for _, o := range m.namespaces {
		names("Namespace", o.Name, o.Labels)
	}
	for _, o := range m.serviceAccounts {
		names("ServiceAccount", o.Name, o.Labels)
	}
	configKeys := map[string]map[string]string{}
	for _, o := range m.configMaps {
		names("ConfigMap", o.Name, o.Labels)
		configKeys[o.Name] = o.Data
	}

	for _, w := range m.workloads() {
		where := w.kind + " " + w.name
		names(w.kind, w.name, w.template.Labels)
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		switch {
		case err != nil || w.selector == nil:
			bad("%s: selector: %v", where, err)
		case sel.Empty():
			bad("%s: empty selector", where)
		case !sel.Matches(labels.Set(w.template.Labels)):
			bad("%s: selector %s does not match the template labels %v", where, sel, w.template.Labels)
		}
		errs = append(errs, m.validatePod(where, w, configKeys)...)
	}

	for _, s := range m.statefulSets {
		if s.Spec.ServiceName == "" {
			bad("StatefulSet %s: no serviceName", s.Name)
			continue
		}
		svc := m.service(s.Spec.ServiceName)
		if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
			bad("StatefulSet %s: serviceName %q is not a headless Service here", s.Name, s.Spec.ServiceName)
		} else if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(s.Spec.Template.Labels)) {
			bad("StatefulSet %s: Service %s does not select its pods", s.Name, svc.Name)
		}
	}

	for _, s := range m.services {
		where := "Service " + s.Name
		names("Service", s.Name, s.Labels)
		for _, msg := range validation.IsDNS1035Label(s.Name) {
			bad("%s: %s", where, msg)
		}
		if len(s.Spec.Selector) == 0 {
			bad("%s: no selector", where)
			continue
		}
		ws := m.podsMatching(labels.SelectorFromSet(s.Spec.Selector))
		if len(ws) == 0 {
			bad("%s: selector %v matches no pods here", where, s.Spec.Selector)
		}
		seen := map[string]bool{}
		for _, p := range s.Spec.Ports {
			if len(s.Spec.Ports) > 1 && p.Name == "" {
				bad("%s: port %d needs a name", where, p.Port)
			}
			if seen[p.Name] {
				bad("%s: duplicate port name %q", where, p.Name)
			}
			seen[p.Name] = true
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			for _, w := range ws {
				if !containerPort(w, target, p.Protocol) {
					bad("%s: port %q targets %s/%s, which %s %s does not expose", where, p.Name, target.String(), p.Protocol, w.kind, w.name)
				}
			}
		}
	}

	for _, p := range m.pdbs {
		where := "PodDisruptionBudget " + p.Name
		names("PodDisruptionBudget", p.Name, p.Labels)
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || p.Spec.Selector == nil {
			bad("%s: selector: %v", where, err)
			continue
		}
		ws := m.podsMatching(sel)
		if len(ws) == 0 {
			bad("%s: selector matches no pods here", where)
		}
		for _, w := range ws {
			if p.Spec.MinAvailable != nil && p.Spec.MinAvailable.Type == intstr.Int && p.Spec.MinAvailable.IntVal >= w.replicas {
				bad("%s: minAvailable %d of %d replicas of %s: no pod could ever be evicted", where, p.Spec.MinAvailable.IntVal, w.replicas, w.name)
			}
		}
	}

	for _, np := range m.netpols {
		where := "NetworkPolicy " + np.Name
		names("NetworkPolicy", np.Name, np.Labels)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			bad("%s: %v", where, err)
			continue
		}
		ws := m.podsMatching(sel)
		if len(ws) == 0 {
			bad("%s: podSelector matches no pods here", where)
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil {
					continue
				}
				proto := corev1.ProtocolTCP
				if p.Protocol != nil {
					proto = *p.Protocol
				}
				for _, w := range ws {
					if !containerPort(w, *p.Port, proto) {
						bad("%s: port %s/%s is not a port of %s %s", where, p.Port.String(), proto, w.kind, w.name)
					}
				}
			}
		}
	}

	errs = append(errs, m.validateRouter()...)
	return errs
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// validatePod checks a pod template: containers, ports, probes, env,
// volumes, resources and the restricted Pod Security Standard.
func (m *manifests) validatePod(where string, w workload, configKeys map[string]map[string]string) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(where+": "+format, args...)) }
	spec := &w.template.Spec
	if len(spec.Containers) == 0 {
		bad("no containers")
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	for _, c := range w.claims {
		volumes[c.Name] = true
		if _, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
			bad("volume claim %s requests no storage", c.Name)
		}
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		bad("uses host namespaces")
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			bad("volume %s is a hostPath", v.Name)
		}
	}
	psc := spec.SecurityContext
	podNonRoot := psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	podSeccomp := psc != nil && psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		bad("runAsUser 0")
	}
	podLabels := labels.Set(w.template.Labels)
	for _, tsc := range spec.TopologySpreadConstraints {
		sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err != nil || !sel.Matches(podLabels) {
			bad("topology spread on %s does not select its own pods", tsc.TopologyKey)
		}
	}

	for _, c := range spec.Containers {
		cw := "container " + c.Name
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			bad("%s: name: %s", cw, msg)
		}
		if c.Image == "" {
			bad("%s: no image", cw)
		}
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.ContainerPort < 1 || p.ContainerPort > 65535 {
				bad("%s: port %d out of range", cw, p.ContainerPort)
			}
			if p.Name != "" {
				for _, msg := range validation.IsValidPortName(p.Name) {
					bad("%s: port name %q: %s", cw, p.Name, msg)
				}
				if ports[p.Name] {
					bad("%s: duplicate port name %q", cw, p.Name)
				}
				ports[p.Name] = true
			}
		}
		for pname, pr := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if pr == nil || pr.HTTPGet == nil {
				continue
			}
			if !strings.HasPrefix(pr.HTTPGet.Path, "/") {
				bad("%s: %s probe path %q", cw, pname, pr.HTTPGet.Path)
			}
			if !containerPort(workload{template: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}}, pr.HTTPGet.Port, corev1.ProtocolTCP) {
				bad("%s: %s probe port %s is not a TCP port of the container", cw, pname, pr.HTTPGet.Port.String())
			}
		}
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			bad("%s: needs liveness and readiness probes", cw)
		}
		defined := map[string]bool{}
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef != nil {
				keys, ok := configKeys[ef.ConfigMapRef.Name]
				if !ok {
					bad("%s: envFrom ConfigMap %q is not here", cw, ef.ConfigMapRef.Name)
				}
				for k := range keys {
					for _, msg := range validation.IsEnvVarName(k) {
						bad("%s: ConfigMap key %q: %s", cw, k, msg)
					}
					defined[k] = true
				}
			}
		}
		for _, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				bad("%s: env %q: %s", cw, e.Name, msg)
			}
			for _, ref := range envRef.FindAllStringSubmatch(e.Value, -1) {
				if !defined[ref[1]] {
					bad("%s: env %s refers to $(%s) before it is defined", cw, e.Name, ref[1])
				}
			}
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				fp := e.ValueFrom.FieldRef.FieldPath
				ok := slices.Contains([]string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName", "status.hostIP", "status.podIP"}, fp) ||
					strings.HasPrefix(fp, "metadata.labels['") || strings.HasPrefix(fp, "metadata.annotations['")
				if !ok {
					bad("%s: env %s: fieldPath %q is not one the downward API offers", cw, e.Name, fp)
				}
			}
			defined[e.Name] = true
		}
		mounts := map[string]bool{}
		for _, vm := range c.VolumeMounts {
			if !volumes[vm.Name] {
				bad("%s: volume mount %q has no volume or claim template", cw, vm.Name)
			}
			if mounts[vm.MountPath] {
				bad("%s: two mounts at %s", cw, vm.MountPath)
			}
			mounts[vm.MountPath] = true
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, ok := c.Resources.Requests[r]
			if !ok {
				bad("%s: no %s request", cw, r)
				continue
			}
			if lim, ok := c.Resources.Limits[r]; ok && req.Cmp(lim) > 0 {
				bad("%s: %s request %s above its limit %s", cw, r, req.String(), lim.String())
			}
		}
		// The namespace enforces the restricted Pod Security Standard.
		sc := c.SecurityContext
		nonRoot := podNonRoot || (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot)
		seccomp := podSeccomp || (sc != nil && sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault)
		switch {
		case !nonRoot:
			bad("%s: runAsNonRoot is not set (restricted)", cw)
		case !seccomp:
			bad("%s: no RuntimeDefault seccomp profile (restricted)", cw)
		case sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			bad("%s: allowPrivilegeEscalation must be false (restricted)", cw)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
			bad("%s: must drop ALL capabilities and add none (restricted)", cw)
		case sc.Privileged != nil && *sc.Privileged:
			bad("%s: privileged", cw)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			bad("%s: root filesystem should be read-only", cw)
		}
	}
	return errs
}

// validateRouter checks what the router deployment itself needs.
func (m *manifests) validateRouter() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("router: "+format, args...)) }
	s := m.router()
	if s == nil {
		return []error{fmt.Errorf("no StatefulSet warmroute")}
	}
	if replicas(s.Spec.Replicas) != 3 {
		bad("%d replicas, want 3 (one per zone, bootstrap-expect 3)", replicas(s.Spec.Replicas))
	}
	if s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		bad("podManagementPolicy %q: with bootstrap-expect every replica must start before any is ready (Parallel)", s.Spec.PodManagementPolicy)
	}
	zoneSpread := false
	for _, tsc := range s.Spec.Template.Spec.TopologySpreadConstraints {
		if tsc.TopologyKey == corev1.LabelTopologyZone && tsc.MaxSkew == 1 && tsc.WhenUnsatisfiable == corev1.DoNotSchedule {
			zoneSpread = true
		}
	}
	if !zoneSpread {
		bad("no hard topology spread over %s", corev1.LabelTopologyZone)
	}
	env := map[string]string{}
	c := m.routerContainer()
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			for _, cm := range m.configMaps {
				if cm.Name == ef.ConfigMapRef.Name {
					for k, v := range cm.Data {
						env[k] = v
					}
				}
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	dataDir := env["WARMROUTE_DATA_DIR"]
	if dataDir == "" {
		bad("WARMROUTE_DATA_DIR is not set")
	}
	onClaim := false
	for _, vm := range c.VolumeMounts {
		for _, cl := range s.Spec.VolumeClaimTemplates {
			if vm.Name == cl.Name && vm.MountPath == dataDir {
				onClaim = true
			}
		}
	}
	if !onClaim {
		bad("the data dir %q is not a persistent volume claim template", dataDir)
	}
	peers := m.service(s.Spec.ServiceName)
	if peers != nil {
		if !peers.Spec.PublishNotReadyAddresses {
			bad("headless Service %s must publish not-ready addresses, or peers cannot find each other before the cluster forms", peers.Name)
		}
		host, _, _ := strings.Cut(env["WARMROUTE_JOIN"], ":")
		if host != peers.Name {
			bad("WARMROUTE_JOIN %q does not name the headless Service %s", env["WARMROUTE_JOIN"], peers.Name)
		}
	}
	if env["WARMROUTE_NODE_NAME"] != "$(POD_NAME)" {
		bad("WARMROUTE_NODE_NAME %q: want the pod name (stable identity)", env["WARMROUTE_NODE_NAME"])
	}
	errs = append(errs, m.validateClusterTLS(env)...)
	hasPDB := false
	for _, p := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err == nil && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
			hasPDB = true
			if p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() < 2 {
				bad("PodDisruptionBudget %s must keep a Raft quorum (minAvailable 2 of 3)", p.Name)
			}
		}
	}
	if !hasPDB {
		bad("no PodDisruptionBudget covers the routers")
	}
	client := m.service("warmroute")
	if client == nil || !containerPort(workload{template: &s.Spec.Template}, client.Spec.Ports[0].TargetPort, corev1.ProtocolTCP) {
		bad("no client-facing Service warmroute on the traffic port")
	}
	return errs
}

// validateClusterTLS checks the routers' mutual TLS: on, each pod with the
// certificate and key named after itself (so the name in the certificate
// is its node name), all from a Secret mounted read-only in full.
func (m *manifests) validateClusterTLS(env map[string]string) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("router: cluster TLS: "+format, args...))
	}
	cert, key, ca := env["WARMROUTE_CLUSTER_TLS_CERT_FILE"], env["WARMROUTE_CLUSTER_TLS_KEY_FILE"], env["WARMROUTE_CLUSTER_TLS_CA_FILE"]
	if cert == "" || key == "" || ca == "" {
		return []error{fmt.Errorf("router: cluster TLS is off: set WARMROUTE_CLUSTER_TLS_CERT_FILE, _KEY_FILE and _CA_FILE")}
	}
	if v := strings.ToLower(env["WARMROUTE_ALLOW_INSECURE_CLUSTER"]); v != "" && v != "false" {
		bad("WARMROUTE_ALLOW_INSECURE_CLUSTER=%s: routers must reach each other over mutual TLS", v)
	}
	if path.Base(cert) != "$(POD_NAME).pem" || path.Base(key) != "$(POD_NAME)-key.pem" {
		bad("certificate %s and key %s: want $(POD_NAME).pem and $(POD_NAME)-key.pem, so each router loads the pair issued for its name", cert, key)
	}
	s := m.router()
	c := m.routerContainer()
	for _, file := range []string{cert, key, ca} {
		var mount *corev1.VolumeMount
		for i, vm := range c.VolumeMounts {
			if path.Dir(file) == path.Clean(vm.MountPath) {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			bad("%s is on no volume mount", file)
			continue
		}
		if !mount.ReadOnly || mount.SubPath != "" {
			bad("%s: mount %s should be read-only and whole (a subPath mount never sees a renewed Secret)", file, mount.Name)
		}
		var vol *corev1.Volume
		for i, v := range s.Spec.Template.Spec.Volumes {
			if v.Name == mount.Name {
				vol = &s.Spec.Template.Spec.Volumes[i]
			}
		}
		switch {
		case vol == nil || vol.Secret == nil:
			bad("%s: volume %s is not a Secret", file, mount.Name)
		case vol.Secret.Optional != nil && *vol.Secret.Optional:
			bad("%s: Secret %s is optional: a router would start without its certificate", file, vol.Secret.SecretName)
		case len(vol.Secret.Items) > 0 && file != ca:
			bad("%s: Secret %s lists items: every pod picks its own pair by name, so every key must be there", file, vol.Secret.SecretName)
		}
	}
	return errs
}

// TestKubernetesEnvNamesAreFlags checks the WARMROUTE_* variables of the
// manifests against the flags of the binary.
func TestKubernetesEnvNamesAreFlags(t *testing.T) {
	m := loadManifests(t)
	var names []string
	for _, cm := range m.configMaps {
		for k := range cm.Data {
			names = append(names, k)
		}
	}
	for _, w := range m.workloads() {
		for _, c := range w.template.Spec.Containers {
			for _, e := range c.Env {
				names = append(names, e.Name)
			}
		}
	}
	sort.Strings(names)
	checkEnvNames(t, "deploy/k8s", names)
}
