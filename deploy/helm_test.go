package deploy

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"

	"github.com/yannh/kubeconform/pkg/validator"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsyaml "sigs.k8s.io/yaml"
)

// The endpoint picker's Helm chart (deploy/helm/warmroute-epp) and its
// rendering with the default values, deploy/k8s/epp/warmroute-epp.yaml,
// which is what `kubectl apply -k deploy/k8s/epp` installs.
//
// Helm cannot be installed here (no Debian package; its binary comes from
// the network), so the chart is rendered by renderChart: Go's
// text/template, as Helm uses, with the few Helm functions the templates
// call (include, toYaml, nindent, quote), .Values from values.yaml and
// overrides, and .Release, .Chart. The templates use nothing else, which
// TestHelmChart enforces by parsing them with only these functions.

var updateChart = flag.Bool("update-chart", false, "rewrite deploy/k8s/epp/warmroute-epp.yaml from the chart")

const (
	chartDir    = "helm/warmroute-epp"
	chartOutput = "k8s/epp/warmroute-epp.yaml"
)

// renderChart renders the chart with values.yaml merged with overrides
// (dotted keys), as `helm template <release> -n <namespace>` would.
func renderChart(t *testing.T, release, namespace string, overrides map[string]any) []byte {
	t.Helper()
	var chart map[string]any
	if err := yaml.Unmarshal(readFile(t, filepath.Join(chartDir, "Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(readFile(t, filepath.Join(chartDir, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	for k, v := range overrides {
		m := values
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			m = m[p].(map[string]any)
		}
		m[parts[len(parts)-1]] = v
	}
	root := template.New("chart").Option("missingkey=error")
	root.Funcs(template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var b bytes.Buffer
			err := root.ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
		"toYaml": func(v any) (string, error) {
			var b bytes.Buffer
			enc := yaml.NewEncoder(&b)
			enc.SetIndent(2)
			if err := enc.Encode(v); err != nil {
				return "", err
			}
			return strings.TrimSuffix(b.String(), "\n"), nil
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"quote": func(v any) string { return strconv.Quote(fmt.Sprint(v)) },
	})
	files, err := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	for _, f := range files {
		if _, err := root.New(filepath.Base(f)).Parse(string(readFile(t, f))); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	data := map[string]any{
		"Values":  values,
		"Release": map[string]any{"Name": release, "Namespace": namespace},
		"Chart":   map[string]any{"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
	}
	var out bytes.Buffer
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasPrefix(name, "_") {
			continue
		}
		var b bytes.Buffer
		if err := root.ExecuteTemplate(&b, name, data); err != nil {
			t.Fatalf("rendering %s: %v", name, err)
		}
		if strings.TrimSpace(b.String()) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: warmroute-epp/templates/%s\n%s\n", name, strings.Trim(b.String(), "\n"))
	}
	return out.Bytes()
}

// eppObjects is a rendered chart, decoded.
type eppObjects struct {
	sts        *appsv1.StatefulSet
	sa         *corev1.ServiceAccount
	cm         *corev1.ConfigMap
	services   map[string]*corev1.Service
	role       *rbacv1.Role
	binding    *rbacv1.RoleBinding
	pdbs       int
	pool       map[string]any // nil when absent
	gateway    map[string]any
	route      map[string]any
	unexpected []string
}

func decodeEPP(t *testing.T, rendered []byte) *eppObjects {
	t.Helper()
	o := &eppObjects{services: map[string]*corev1.Service{}}
	for i, doc := range splitYAML(t, chartOutput, rendered) {
		var tm struct{ APIVersion, Kind string }
		if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		strictInto := func(v any) {
			js, err := sigsyaml.YAMLToJSONStrict(doc)
			if err == nil {
				err = strictJSON(js, v)
			}
			if err != nil {
				t.Errorf("document %d (%s): %v", i+1, tm.Kind, err)
			}
		}
		switch tm.APIVersion + "/" + tm.Kind {
		case "rbac.authorization.k8s.io/v1/Role":
			o.role = &rbacv1.Role{}
			strictInto(o.role)
			continue
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			o.binding = &rbacv1.RoleBinding{}
			strictInto(o.binding)
			continue
		case "inference.networking.k8s.io/v1/InferencePool", "gateway.networking.k8s.io/v1/Gateway", "gateway.networking.k8s.io/v1/HTTPRoute":
			var m map[string]any
			if err := sigsyaml.Unmarshal(doc, &m); err != nil {
				t.Fatal(err)
			}
			switch tm.Kind {
			case "InferencePool":
				o.pool = m
			case "Gateway":
				o.gateway = m
			default:
				o.route = m
			}
			continue
		}
		obj, err := decodeStrict(doc)
		if err != nil {
			t.Errorf("document %d: %v", i+1, err)
			continue
		}
		switch v := obj.(type) {
		case *appsv1.StatefulSet:
			o.sts = v
		case *corev1.ServiceAccount:
			o.sa = v
		case *corev1.ConfigMap:
			o.cm = v
		case *corev1.Service:
			o.services[v.Name] = v
		default:
			if tm.Kind == "PodDisruptionBudget" {
				o.pdbs++
			} else {
				o.unexpected = append(o.unexpected, tm.Kind)
			}
		}
	}
	return o
}

func strictJSON(js []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(js)) // JSON is YAML
	dec.KnownFields(true)
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return err
	}
	return sigsyaml.UnmarshalStrict(js, v)
}

func str(m map[string]any, path ...string) string {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = mm[p]
	}
	if cur == nil {
		return ""
	}
	return fmt.Sprint(cur)
}

// validate reports what makes the rendered objects not work together.
func (o *eppObjects) validate(replicas int, withPool, withGateway bool) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.sts == nil || o.sa == nil || o.cm == nil || o.role == nil || o.binding == nil || o.pdbs != 1 || len(o.unexpected) > 0 {
		bad("want a StatefulSet, ServiceAccount, ConfigMap, Role, RoleBinding and PDB, and nothing unexpected (%v)", o.unexpected)
		return errs
	}
	env := o.cm.Data
	spec := &o.sts.Spec.Template.Spec
	if spec.ServiceAccountName != o.sa.Name || spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		bad("the pods must run as ServiceAccount %s with its token mounted (Kubernetes discovery reads the API)", o.sa.Name)
	}
	if o.binding.RoleRef.Name != o.role.Name || len(o.binding.Subjects) != 1 || o.binding.Subjects[0].Name != o.sa.Name {
		bad("the RoleBinding must bind Role %s to ServiceAccount %s", o.role.Name, o.sa.Name)
	}
	grants := func(group, resource, verb string) bool {
		for _, r := range o.role.Rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	if !grants("", "pods", "list") || !grants("inference.networking.k8s.io", "inferencepools", "get") {
		bad("the Role must grant list on pods and get on inferencepools")
	}
	if o.sts.Spec.Replicas == nil || int(*o.sts.Spec.Replicas) != replicas || env["WARMROUTE_BOOTSTRAP_EXPECT"] != strconv.Itoa(replicas) {
		bad("replicas %v and WARMROUTE_BOOTSTRAP_EXPECT %q must both be %d", o.sts.Spec.Replicas, env["WARMROUTE_BOOTSTRAP_EXPECT"], replicas)
	}
	c := &spec.Containers[0]
	port := func(name string) int32 {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
		return 0
	}
	grpcPort, healthPort := port("grpc"), port("grpc-health")
	if !strings.HasSuffix(env["WARMROUTE_EXT_PROC_LISTEN"], fmt.Sprintf(":%d", grpcPort)) || grpcPort == 0 {
		bad("WARMROUTE_EXT_PROC_LISTEN %q is not on the container's grpc port %d", env["WARMROUTE_EXT_PROC_LISTEN"], grpcPort)
	}
	if !strings.HasSuffix(env["WARMROUTE_EXT_PROC_HEALTH_LISTEN"], fmt.Sprintf(":%d", healthPort)) || healthPort == 0 {
		bad("WARMROUTE_EXT_PROC_HEALTH_LISTEN %q is not on the container's grpc-health port %d", env["WARMROUTE_EXT_PROC_HEALTH_LISTEN"], healthPort)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := "liveness"
		if name == "readiness" {
			want = "readiness"
		}
		if p == nil || p.GRPC == nil || p.GRPC.Port != healthPort || p.GRPC.Service == nil || *p.GRPC.Service != want {
			bad("the %s probe must be gRPC on the health port %d, service %q", name, healthPort, want)
		}
	}
	podLabels := labels.Set(o.sts.Spec.Template.Labels)
	svcName := o.sts.Name
	svc := o.services[svcName]
	if svc == nil || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		bad("no Service %s selecting the picker pods", svcName)
	} else if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].TargetPort.String() != "grpc" {
		bad("Service %s's first port must target the grpc port", svcName)
	}
	if peers := o.services[o.sts.Spec.ServiceName]; peers == nil || peers.Spec.ClusterIP != "None" || !peers.Spec.PublishNotReadyAddresses ||
		env["WARMROUTE_JOIN"] != peers.Name+":7946" {
		bad("the headless peers Service %s must publish not-ready pods and be WARMROUTE_JOIN (%q)", o.sts.Spec.ServiceName, env["WARMROUTE_JOIN"])
	}
	if withPool != (o.pool != nil) {
		bad("InferencePool present %v, want %v", o.pool != nil, withPool)
	}
	if o.pool != nil {
		name := str(o.pool, "metadata", "name")
		if env["WARMROUTE_DISCOVERY_K8S_POOL"] != name {
			bad("WARMROUTE_DISCOVERY_K8S_POOL %q is not the pool %q", env["WARMROUTE_DISCOVERY_K8S_POOL"], name)
		}
		if str(o.pool, "spec", "endpointPickerRef", "name") != svcName || str(o.pool, "spec", "endpointPickerRef", "kind") != "Service" ||
			svc == nil || str(o.pool, "spec", "endpointPickerRef", "port", "number") != strconv.Itoa(int(svc.Spec.Ports[0].Port)) {
			bad("the pool's endpointPickerRef must name Service %s on its grpc port", svcName)
		}
		if fm := str(o.pool, "spec", "endpointPickerRef", "failureMode"); fm != "FailClose" && fm != "FailOpen" {
			bad("failureMode %q: want FailClose or FailOpen", fm)
		}
		ports, _ := o.pool["spec"].(map[string]any)["targetPorts"].([]any)
		if len(ports) < 1 || len(ports) > 8 {
			bad("the pool needs 1-8 targetPorts, has %d", len(ports))
		}
		if sel, _ := o.pool["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any); len(sel) == 0 {
			bad("the pool's selector has no matchLabels")
		}
		if str(o.pool, "metadata", "namespace") != o.sts.Namespace {
			bad("the pool must be in the picker's namespace (Kubernetes discovery reads its own)")
		}
	}
	if withGateway != (o.gateway != nil && o.route != nil) {
		bad("Gateway and HTTPRoute present %v, want %v", o.gateway != nil && o.route != nil, withGateway)
	}
	if o.route != nil {
		rules, _ := o.route["spec"].(map[string]any)["rules"].([]any)
		ok := false
		for _, r := range rules {
			for _, b := range r.(map[string]any)["backendRefs"].([]any) {
				bm := b.(map[string]any)
				ok = ok || bm["kind"] == "InferencePool" && bm["group"] == "inference.networking.k8s.io" && bm["name"] == str(o.pool, "metadata", "name")
			}
		}
		parents, _ := o.route["spec"].(map[string]any)["parentRefs"].([]any)
		if !ok || len(parents) != 1 || parents[0].(map[string]any)["name"] != str(o.gateway, "metadata", "name") {
			bad("the HTTPRoute must send to the InferencePool from the example Gateway")
		}
		if str(o.gateway, "spec", "gatewayClassName") == "" {
			bad("the Gateway names no gatewayClassName")
		}
	}
	return errs
}

// TestHelmChart renders the chart, compares the default rendering with
// deploy/k8s/epp/warmroute-epp.yaml, and checks the objects with
// kubeconform (the core kinds) and field by field (how they fit together),
// also with a one-replica release that brings its own pool and gateway.
func TestHelmChart(t *testing.T) {
	rendered := renderChart(t, "warmroute", "default", nil)
	if *updateChart {
		if err := os.WriteFile(chartOutput, rendered, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if onDisk := readFile(t, chartOutput); !bytes.Equal(onDisk, rendered) {
		t.Errorf("%s is not the chart rendered with its default values: go test ./deploy -run TestHelmChart -update-chart", chartOutput)
	}
	v := newSchemaValidator(t)
	cases := []struct {
		name                  string
		overrides             map[string]any
		replicas              int
		withPool, withGateway bool
	}{
		{"defaults", nil, 3, true, true},
		{"one replica, pool and gateway elsewhere", map[string]any{"replicas": 1, "inferencePool.create": false, "gateway.create": false}, 1, false, false},
	}
	for _, tc := range cases {
		out := renderChart(t, "warmroute", "llm", tc.overrides)
		for _, r := range validateSchema(v, tc.name, out) {
			sig, _ := r.Resource.Signature()
			if sig != nil && (strings.Contains(sig.Version, "inference.networking") || strings.Contains(sig.Version, "gateway.networking")) {
				continue // custom resources: checked field by field
			}
			if r.Status != validator.Valid && r.Status != validator.Empty {
				t.Errorf("%s: %v: %s", tc.name, sig, describeResult(r))
			}
		}
		o := decodeEPP(t, out)
		for _, err := range o.validate(tc.replicas, tc.withPool, tc.withGateway) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if o.cm != nil {
			var names []string
			for k := range o.cm.Data {
				names = append(names, k)
			}
			for _, e := range o.sts.Spec.Template.Spec.Containers[0].Env {
				names = append(names, e.Name)
			}
			checkEnvNames(t, tc.name, names)
		}
	}
}

// TestHelmChartChecksCatchMistakes shows the checks fail on the mistakes
// they are there to catch.
func TestHelmChartChecksCatchMistakes(t *testing.T) {
	load := func(t *testing.T) *eppObjects { return decodeEPP(t, renderChart(t, "warmroute", "default", nil)) }
	for name, breaker := range map[string]func(*eppObjects){
		"pool names another Service": func(o *eppObjects) {
			o.pool["spec"].(map[string]any)["endpointPickerRef"].(map[string]any)["name"] = "other"
		},
		"discovery names another pool": func(o *eppObjects) { o.cm.Data["WARMROUTE_DISCOVERY_K8S_POOL"] = "other" },
		"no pod list grant":            func(o *eppObjects) { o.role.Rules = o.role.Rules[1:] },
		"health on the TLS port": func(o *eppObjects) {
			o.sts.Spec.Template.Spec.Containers[0].ReadinessProbe.GRPC.Port = 9002
		},
		"bootstrap-expect off": func(o *eppObjects) { o.cm.Data["WARMROUTE_BOOTSTRAP_EXPECT"] = "2" },
		"route to a Service":   func(o *eppObjects) { o.route["spec"].(map[string]any)["rules"] = []any{} },
		"token not mounted":    func(o *eppObjects) { f := false; o.sts.Spec.Template.Spec.AutomountServiceAccountToken = &f },
	} {
		o := load(t)
		if errs := o.validate(3, true, true); len(errs) != 0 {
			t.Fatalf("the rendering itself fails: %v", errs)
		}
		breaker(o)
		if errs := o.validate(3, true, true); len(errs) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}
}
