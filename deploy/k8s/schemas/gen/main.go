// Command gen writes the JSON schemas that deploy's tests validate the
// Kubernetes manifests against, offline, with kubeconform.
//
// It reads the official OpenAPI v2 spec (api/openapi-spec/swagger.json) of
// one Kubernetes release from the k8s.io/kubernetes module, which `go mod
// download` fetches through the Go module proxy, and converts the definition
// of every apiVersion/kind used in the manifests into one standalone JSON
// schema (draft 4), the way kubeconform's "-standalone-strict" schemas are
// made:
//
//   - the definitions a kind refers to are bundled under "definitions" in the
//     same file, so no schema refers to another file or to the network;
//   - IntOrString accepts a string or an integer, Quantity a string or a
//     number, as the API server's decoders do;
//   - every object with declared properties gets additionalProperties: false
//     (strict: unknown fields are errors);
//   - fields that are not required and have a declared type (scalars, lists,
//     maps) also accept null, which the API server decodes as unset;
//   - apiVersion and kind are restricted to the kind's own values.
//
// Run it from deploy/ (go generate ./deploy does):
//
//	go run ./k8s/schemas/gen -kubernetes v1.37.2 -manifests k8s,k8s/epp
//
// It replaces the schema directory of that release, and writes the README
// beside it.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// definitionsRef is how the OpenAPI v2 spec, and the generated schemas,
// refer to a definition.
const definitionsRef = "#/definitions/"

func main() {
	version := flag.String("kubernetes", "v1.37.2", "Kubernetes release (k8s.io/kubernetes module version) whose OpenAPI spec to use")
	manifests := flag.String("manifests", "k8s", "directories (comma-separated) of the manifests whose kinds need a schema")
	out := flag.String("out", "k8s/schemas", "directory to write the schemas into")
	swagger := flag.String("swagger", "", "read this swagger.json instead of the one in k8s.io/kubernetes@<version>")
	flag.Parse()
	if err := run(*version, *manifests, *out, *swagger); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(version, manifestDir, out, swaggerPath string) error {
	if !strings.HasPrefix(version, "v") {
		return fmt.Errorf("-kubernetes %q: want a module version such as v1.37.2", version)
	}
	var kinds []gvk
	for _, d := range strings.Split(manifestDir, ",") {
		k, err := manifestKinds(d)
		if err != nil {
			return err
		}
		for _, g := range k {
			if !slices.Contains(kinds, g) {
				kinds = append(kinds, g)
			}
		}
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].String() < kinds[j].String() })
	if len(kinds) == 0 {
		return fmt.Errorf("no Kubernetes resources found in %s", manifestDir)
	}
	if swaggerPath == "" {
		dir, err := moduleDir("k8s.io/kubernetes", version)
		if err != nil {
			return err
		}
		swaggerPath = filepath.Join(dir, "api", "openapi-spec", "swagger.json")
	}
	b, err := os.ReadFile(swaggerPath)
	if err != nil {
		return err
	}
	var spec struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", swaggerPath, err)
	}
	if len(spec.Definitions) == 0 {
		return fmt.Errorf("%s: no definitions", swaggerPath)
	}

	dir := filepath.Join(out, version+"-standalone-strict")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var files []string
	for _, gvk := range kinds {
		schema, err := standalone(spec.Definitions, gvk)
		if err != nil {
			return err
		}
		js, err := json.MarshalIndent(schema, "", " ")
		if err != nil {
			return err
		}
		name := gvk.fileName()
		if err := os.WriteFile(filepath.Join(dir, name), append(js, '\n'), 0o644); err != nil {
			return err
		}
		files = append(files, name)
	}
	sort.Strings(files)
	return writeReadme(filepath.Join(out, "README.md"), version, dir, files)
}

// gvk is an apiVersion (group/version, or version alone for the core group)
// and a kind.
type gvk struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
}

func (g gvk) String() string { return g.APIVersion + " " + g.Kind }

// fileName is the name kubeconform looks the schema up under:
// <kind>[-<first label of the group>]-<version>.json, lower case.
func (g gvk) fileName() string {
	name := strings.ToLower(g.Kind)
	if group, version, ok := strings.Cut(g.APIVersion, "/"); ok {
		first, _, _ := strings.Cut(group, ".")
		name += "-" + strings.ToLower(first) + "-" + strings.ToLower(version)
	} else {
		name += "-" + strings.ToLower(g.APIVersion)
	}
	return name + ".json"
}

// manifestKinds returns the apiVersion/kind pairs of the resources in the
// directory's YAML files (kustomization.yaml is not a resource), sorted.
func manifestKinds(dir string) ([]gvk, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	seen := map[gvk]bool{}
	for _, p := range paths {
		if filepath.Base(p) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var g gvk
			err := dec.Decode(&g)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if g != (gvk{}) && !customResource(g) {
				seen[g] = true
			}
		}
	}
	var out []gvk
	for g := range seen {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// customGroups are the API groups of custom resources the manifests use
// (the Inference Extension's and the Gateway API's): the Kubernetes spec
// has no schema for them, and deploy's tests check them field by field.
var customGroups = []string{"inference.networking.k8s.io", "gateway.networking.k8s.io"}

func customResource(g gvk) bool {
	group, _, ok := strings.Cut(g.APIVersion, "/")
	return ok && slices.Contains(customGroups, group)
}

// moduleDir downloads a module through the Go module proxy (or finds it in
// the module cache) and returns its directory. It runs outside the current
// module so that go.mod is left alone.
func moduleDir(path, version string) (string, error) {
	tmp, err := os.MkdirTemp("", "schemagen")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "mod", "download", "-json", path+"@"+version)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	var res struct {
		Dir   string
		Error string
	}
	if jerr := json.Unmarshal(b, &res); jerr == nil && res.Error != "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", path, version, res.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", path, version, err, stderr.Bytes())
	}
	if res.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no directory in %q", path, version, b)
	}
	return res.Dir, nil
}

// special replaces definitions whose Go types decode more than their OpenAPI
// type says.
var special = map[string]map[string]any{
	"io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}},
	},
	"io.k8s.apimachinery.pkg.api.resource.Quantity": {
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}},
	},
}

// standalone builds the schema of one kind with every definition it refers
// to, directly or not, bundled under "definitions".
func standalone(defs map[string]map[string]any, g gvk) (map[string]any, error) {
	name, err := definitionOf(defs, g)
	if err != nil {
		return nil, err
	}
	root := strictify(clone(defs[name])).(map[string]any)
	props, _ := root["properties"].(map[string]any)
	for field, value := range map[string]string{"apiVersion": g.APIVersion, "kind": g.Kind} {
		p, ok := props[field].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s (%s) has no %s property", g, name, field)
		}
		p["enum"] = []any{value}
	}
	root["$schema"] = "http://json-schema.org/draft-04/schema#"

	bundled := map[string]any{}
	queue := refs(defs[name], nil)
	for len(queue) > 0 {
		ref := queue[0]
		queue = queue[1:]
		if _, done := bundled[ref]; done {
			continue
		}
		if s, ok := special[ref]; ok {
			bundled[ref] = s
			continue
		}
		d, ok := defs[ref]
		if !ok {
			return nil, fmt.Errorf("%s: definition %s not in the spec", g, ref)
		}
		bundled[ref] = strictify(clone(d))
		queue = refs(d, queue)
	}
	if len(bundled) > 0 {
		root["definitions"] = bundled
	}
	return root, nil
}

// definitionOf finds the definition whose x-kubernetes-group-version-kind
// names the apiVersion and kind.
func definitionOf(defs map[string]map[string]any, g gvk) (string, error) {
	group, version, ok := strings.Cut(g.APIVersion, "/")
	if !ok {
		group, version = "", g.APIVersion
	}
	var found []string
	for name, d := range defs {
		list, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, e := range list {
			m, _ := e.(map[string]any)
			if m["group"] == group && m["version"] == version && m["kind"] == g.Kind {
				found = append(found, name)
			}
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%s: no such kind in the OpenAPI spec", g)
	case 1:
		return found[0], nil
	default:
		sort.Strings(found)
		return "", fmt.Errorf("%s: several definitions: %v", g, found)
	}
}

// refs appends the definitions a schema refers to.
func refs(v any, acc []string) []string {
	switch v := v.(type) {
	case map[string]any:
		if r, ok := v["$ref"].(string); ok {
			if name, ok := strings.CutPrefix(r, definitionsRef); ok {
				acc = append(acc, name)
			}
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			acc = refs(v[k], acc)
		}
	case []any:
		for _, e := range v {
			acc = refs(e, acc)
		}
	}
	return acc
}

// strictify applies the strict rules to a schema and the schemas nested in
// it. Only schema keywords are walked, never data such as enum or default.
func strictify(v any) any {
	s, ok := v.(map[string]any)
	if !ok {
		return v
	}
	if f, _ := s["format"].(string); f == "int-or-string" {
		return clone(special["io.k8s.apimachinery.pkg.util.intstr.IntOrString"])
	}
	for _, k := range []string{"items", "additionalProperties", "not"} {
		if sub, ok := s[k]; ok {
			s[k] = strictify(sub)
		}
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		if list, ok := s[k].([]any); ok {
			for i := range list {
				list[i] = strictify(list[i])
			}
		}
	}
	props, ok := s["properties"].(map[string]any)
	if !ok {
		return s
	}
	if _, set := s["additionalProperties"]; !set {
		s["additionalProperties"] = false
	}
	required := map[string]bool{}
	if list, ok := s["required"].([]any); ok {
		for _, r := range list {
			if name, ok := r.(string); ok {
				required[name] = true
			}
		}
	}
	for name, p := range props {
		p = strictify(p)
		if !required[name] {
			p = nullable(p)
		}
		props[name] = p
	}
	return s
}

// nullable lets a schema with a declared type also accept null. Fields that
// only refer to a definition are left alone, as openapi2jsonschema leaves
// them: wrapping them in anyOf would bury the errors inside them.
func nullable(v any) any {
	s, ok := v.(map[string]any)
	if !ok {
		return v
	}
	if t, ok := s["type"].(string); ok {
		s["type"] = []any{t, "null"}
	}
	return s
}

// clone deep-copies decoded JSON.
func clone(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = clone(e)
		}
		return m
	case []any:
		l := make([]any, len(v))
		for i, e := range v {
			l[i] = clone(e)
		}
		return l
	default:
		return v
	}
}

func writeReadme(path, version, dir string, files []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, `# Kubernetes JSON schemas

Generated by deploy/k8s/schemas/gen from the OpenAPI v2 spec
(api/openapi-spec/swagger.json) of k8s.io/kubernetes@%s, fetched through the
Go module proxy. Do not edit by hand; regenerate from deploy/ with

    go run ./k8s/schemas/gen -kubernetes %s -manifests k8s,k8s/epp

(also run by go generate ./deploy). TestKubernetesSchemas in
deploy/k8s_schema_test.go validates every manifest in deploy/k8s against them
with kubeconform, offline, and TestHelmChart the endpoint picker's
(deploy/k8s/epp, the rendered Helm chart). The generator writes one schema
for each apiVersion/kind the manifests use, so rerun it after adding a
kind. Custom resources (InferencePool, Gateway, HTTPRoute) have no schema
here; the tests check them field by field.

%s/:

`, version, version, filepath.Base(dir))
	for _, f := range files {
		fmt.Fprintf(&b, "- %s\n", f)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
