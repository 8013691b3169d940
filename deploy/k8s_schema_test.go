package deploy

//go:generate go run ./k8s/schemas/gen -kubernetes v1.37.2 -manifests k8s,k8s/epp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/yannh/kubeconform/pkg/validator"
	sigsyaml "sigs.k8s.io/yaml"
)

// schemaKubernetesVersion is the Kubernetes release whose OpenAPI spec the
// checked-in schemas were generated from (k8s.io/kubernetes module version,
// without the v; it matches k8s.io/api v0.37.2).
const schemaKubernetesVersion = "1.37.2"

// schemaDir holds the generated schemas (see k8s/schemas/README.md).
var schemaDir = filepath.Join(k8sDir, "schemas")

// newSchemaValidator returns kubeconform in strict mode reading schemas only
// from schemaDir: no schema is fetched from the network.
func newSchemaValidator(t *testing.T) validator.Validator {
	t.Helper()
	dir, err := filepath.Abs(schemaDir)
	if err != nil {
		t.Fatal(err)
	}
	location := filepath.Join(dir, "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}", "{{ .ResourceKind }}{{ .KindSuffix }}.json")
	v, err := validator.New([]string{location}, validator.Opts{
		Strict:            true,
		KubernetesVersion: schemaKubernetesVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// validateSchema runs kubeconform over one YAML stream.
func validateSchema(v validator.Validator, name string, doc []byte) []validator.Result {
	return v.Validate(name, io.NopCloser(bytes.NewReader(doc)))
}

var statusNames = map[validator.Status]string{
	validator.Error:   "error",
	validator.Skipped: "skipped",
	validator.Valid:   "valid",
	validator.Invalid: "invalid",
	validator.Empty:   "empty",
}

func describeResult(r validator.Result) string {
	var b strings.Builder
	b.WriteString(statusNames[r.Status])
	if r.Err != nil {
		b.WriteString(": ")
		b.WriteString(r.Err.Error())
	}
	return b.String()
}

// TestKubernetesSchemas validates every resource in deploy/k8s with
// kubeconform against the JSON schemas generated from the Kubernetes
// OpenAPI spec. Each must be valid: a resource whose kind has no schema is
// an error, never skipped.
func TestKubernetesSchemas(t *testing.T) {
	v := newSchemaValidator(t)
	kinds := map[string]int{}
	total, valid := 0, 0
	for _, f := range kustomizeFiles(t) {
		path := filepath.Join(k8sDir, f)
		b := readFile(t, path)
		want := len(yamlDocs(t, path))
		got := 0
		for _, r := range validateSchema(v, path, b) {
			if r.Status == validator.Empty {
				continue
			}
			got++
			sig, _ := r.Resource.Signature()
			what := path
			if sig != nil {
				what = path + ": " + sig.Version + " " + sig.Kind + " " + sig.Name
				kinds[sig.Version+" "+sig.Kind]++
			}
			if r.Status != validator.Valid {
				t.Errorf("%s: %s", what, describeResult(r))
				continue
			}
			valid++
		}
		if got != want {
			t.Errorf("%s: kubeconform saw %d resources, the file has %d documents", path, got, want)
		}
		total += got
	}
	if total == 0 {
		t.Fatal("no resources validated")
	}
	names := make([]string, 0, len(kinds))
	for k, n := range kinds {
		names = append(names, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(names)
	t.Logf("%d of %d resources valid against the Kubernetes v%s schemas: %s", valid, total, schemaKubernetesVersion, strings.Join(names, ", "))
}

// TestKubernetesSchemasCatchMistakes feeds kubeconform broken resources and
// expects each to be reported, at the right place.
func TestKubernetesSchemasCatchMistakes(t *testing.T) {
	v := newSchemaValidator(t)
	const pod = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: x\nspec:\n  selector:\n    matchLabels: {app: x}\n  serviceName: x\n  template:\n    metadata:\n      labels: {app: x}\n    spec:\n      containers:\n"
	good := map[string]string{
		"Service":     "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetPort: http\n",
		"StatefulSet": pod + "        - name: c\n          image: x\n          ports:\n            - containerPort: 80\n          resources:\n            requests: {cpu: 1, memory: 64Mi}\n",
		"null field":  "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n  labels:\nspec:\n  ports:\n    - port: 80\n",
	}
	for name, doc := range good {
		for _, r := range validateSchema(v, name, []byte(doc)) {
			if r.Status != validator.Valid {
				t.Errorf("valid %s: %s", name, describeResult(r))
			}
		}
	}

	bad := []struct {
		name, doc string
		status    validator.Status
		want      string // part of the error: where and what
	}{
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  publishNotReady: true\n", validator.Invalid,
			"at '/spec': additional properties 'publishNotReady' not allowed"},
		{"wrong case", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ClusterIP: None\n", validator.Invalid,
			"at '/spec': additional properties 'ClusterIP' not allowed"},
		{"wrong type", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: eighty\n", validator.Invalid,
			"at '/spec/ports/0/port': got string, want integer"},
		{"missing Service port", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - name: http\n      targetPort: 8080\n", validator.Invalid,
			"at '/spec/ports/0': missing property 'port'"},
		{"missing container name", pod + "        - image: x\n", validator.Invalid,
			"at '/spec/template/spec/containers/0': missing property 'name'"},
		{"misplaced field", pod + "        - name: c\n          containerPorts:\n            - containerPort: 80\n", validator.Invalid,
			"at '/spec/template/spec/containers/0': additional properties 'containerPorts' not allowed"},
		{"object for a string", pod + "        - name: c\n          image: {name: x}\n", validator.Invalid,
			"at '/spec/template/spec/containers/0/image': got object, want null or string"},
		{"string for a list", pod + "        - name: c\n          args: --serve\n", validator.Invalid,
			"at '/spec/template/spec/containers/0/args': got string, want null or array"},
		{"int-or-string given a list", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetPort: [8080]\n", validator.Invalid,
			"at '/spec/ports/0/targetPort': 'oneOf' failed"},
		{"quantity given a list", pod + "        - name: c\n          resources:\n            limits: {memory: [1Gi]}\n", validator.Invalid,
			"at '/spec/template/spec/containers/0/resources/limits/memory': 'oneOf' failed"},
		{"missing selector", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: x\nspec:\n  template: {}\n", validator.Invalid,
			"at '/spec': missing property 'selector'"},
		{"unknown top-level field", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndatas:\n  a: b\n", validator.Invalid,
			"at '': additional properties 'datas' not allowed"},
		{"unknown kind", "apiVersion: apps/v1\nkind: StatefullSet\nmetadata:\n  name: x\n", validator.Error,
			"could not find schema for StatefullSet"},
		{"kind in the wrong group", "apiVersion: apps/v1\nkind: Service\nmetadata:\n  name: x\n", validator.Error,
			"could not find schema for Service"},
		{"duplicate key", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n  name: y\n", validator.Error,
			`key "name" already set`},
	}
	for _, c := range bad {
		rs := validateSchema(v, c.name, []byte(c.doc))
		if len(rs) != 1 {
			t.Errorf("%s: %d results, want 1", c.name, len(rs))
			continue
		}
		r := rs[0]
		got := describeResult(r)
		switch {
		case r.Status != c.status:
			t.Errorf("%s: got %s, want %s", c.name, got, statusNames[c.status])
		case !strings.Contains(got, c.want):
			t.Errorf("%s: error does not say %q: %s", c.name, c.want, got)
		default:
			t.Logf("%s: %s", c.name, got)
		}
	}
}

// TestKubernetesSchemaFiles checks the schema directory holds one schema for
// each kind the manifests use and nothing else, and that no schema refers
// outside its own file (which would make kubeconform fetch it).
func TestKubernetesSchemaFiles(t *testing.T) {
	dir := filepath.Join(schemaDir, "v"+schemaKubernetesVersion+"-standalone-strict")
	want := map[string]bool{}
	var paths []string
	for _, f := range kustomizeFiles(t) {
		paths = append(paths, filepath.Join(k8sDir, f))
	}
	// The endpoint picker's manifests (the rendered Helm chart), less its
	// custom resources, which have no schema.
	paths = append(paths, chartOutput)
	for _, path := range paths {
		for _, doc := range yamlDocs(t, path) {
			var tm struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tm.APIVersion, "inference.networking.k8s.io/") || strings.Contains(tm.APIVersion, "gateway.networking.k8s.io/") {
				continue
			}
			want[schemaFileName(tm.APIVersion, tm.Kind)] = true
		}
	}
	got := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		got[d.Name()] = true
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var s any
		if err := json.Unmarshal(b, &s); err != nil {
			t.Errorf("%s: %v", path, err)
			return nil
		}
		for _, ref := range schemaRefs(s, nil) {
			if !strings.HasPrefix(ref, "#/definitions/") {
				t.Errorf("%s: $ref %q leaves the file", path, ref)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for f := range want {
		if !got[f] {
			t.Errorf("no schema %s in %s: run go generate ./deploy (see %s/README.md)", f, dir, schemaDir)
		}
	}
	for f := range got {
		if !want[f] {
			t.Errorf("schema %s in %s is for a kind no manifest uses: run go generate ./deploy", f, dir)
		}
	}
}

// schemaFileName is the file kubeconform looks a kind's schema up under.
func schemaFileName(apiVersion, kind string) string {
	name := strings.ToLower(kind)
	if group, version, ok := strings.Cut(apiVersion, "/"); ok {
		first, _, _ := strings.Cut(group, ".")
		return name + "-" + strings.ToLower(first) + "-" + strings.ToLower(version) + ".json"
	}
	return name + "-" + strings.ToLower(apiVersion) + ".json"
}

func schemaRefs(v any, acc []string) []string {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == "$ref" {
				acc = append(acc, s)
			}
			acc = schemaRefs(e, acc)
		}
	case []any:
		for _, e := range v {
			acc = schemaRefs(e, acc)
		}
	}
	return acc
}
