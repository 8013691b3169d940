package layers

import (
	"bufio"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// rule forbids the packages under from to import, directly or not, the
// packages under to (or, with only set, any package of the module outside
// it).
type rule struct {
	from []string
	to   string
	only string
	why  string
}

var rules = []rule{
	{from: []string{"gossip", "ring", "proxy"}, to: "node", why: "node composes gossip, ring and proxy"},
	{from: []string{"loadtest"}, to: "node", why: "the tools talk to routers over HTTP; shared parsers live in internal/"},
	{from: []string{"internal"}, only: "internal", why: "internal/ holds leaves"},
	{from: []string{"internal/testkit"}, only: "internal/testkit", why: "every package's tests may use the test kit"},
}

// under reports whether the module-relative package path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

func TestImportGraph(t *testing.T) {
	root, module := moduleRoot(t)
	graph := importGraph(t, root, module)
	// The walk must have seen the packages the rules speak of, or every
	// rule would pass on an empty graph.
	for _, p := range []string{"node", "node/cluster", "gossip", "ring", "proxy", "loadtest", "internal/backendspec", "internal/testkit", "cmd/warmroute"} {
		if _, ok := graph[p]; !ok {
			t.Fatalf("package %s not found under %s: the walk is broken", p, root)
		}
	}
	for _, r := range rules {
		for p := range graph {
			if !slices.ContainsFunc(r.from, func(d string) bool { return under(p, d) }) {
				continue
			}
			for _, path := range reach(graph, p) {
				dep := path[len(path)-1]
				if (r.to != "" && under(dep, r.to)) || (r.only != "" && !under(dep, r.only)) {
					t.Errorf("%s imports %s (%s): %s", p, dep, strings.Join(path, " -> "), r.why)
				}
			}
		}
	}
}

// reach returns, for every package of the module that p imports directly
// or not, one import path from p to it.
func reach(graph map[string][]string, p string) [][]string {
	var out [][]string
	seen := map[string]bool{p: true}
	queue := [][]string{{p}}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		for _, dep := range graph[path[len(path)-1]] {
			if seen[dep] {
				continue
			}
			seen[dep] = true
			next := append(slices.Clone(path), dep)
			out = append(out, next)
			queue = append(queue, next)
		}
	}
	return out
}

// moduleRoot finds the directory holding go.mod above the test's and the
// module path it declares.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		f, err := os.Open(filepath.Join(dir, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.TrimSpace(m)
				}
			}
			t.Fatalf("%s/go.mod names no module", dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// importGraph maps every package of the module (by its path relative to
// the module) to the packages of the module its non-test files import.
// Files of every build tag and GOOS count: an import behind a tag is still
// an arrow.
func importGraph(t *testing.T, root, module string) map[string][]string {
	t.Helper()
	graph := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		deps := graph[pkg]
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if dep, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(deps, dep) {
				deps = append(deps, dep)
			}
		}
		graph[pkg] = deps
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return graph
}
