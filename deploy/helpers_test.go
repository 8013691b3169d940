package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// repoRoot is the module root, relative to this package's directory.
const repoRoot = ".."

// yamlDocs splits a multi-document YAML file into its documents, each
// re-encoded on its own; empty documents are dropped.
func yamlDocs(t *testing.T, path string) [][]byte {
	t.Helper()
	return splitYAML(t, path, readFile(t, path))
}

// readFile returns the content of the file at path.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func splitYAML(t *testing.T, name string, b []byte) [][]byte {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out [][]byte
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(n.Content) == 0 || (n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null") {
			continue
		}
		doc, err := yaml.Marshal(&n)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, doc)
	}
}

// checkBreakers breaks a freshly loaded valid configuration with each
// breaker and expects its validate method to notice.
func checkBreakers[T interface{ validate() []error }](t *testing.T, load func(*testing.T) T, breakers map[string]func(T)) {
	t.Helper()
	for name, brk := range breakers {
		t.Run(name, func(t *testing.T) {
			c := load(t)
			if errs := c.validate(); len(errs) > 0 {
				t.Fatalf("invalid before breaking it: %v", errs)
			}
			brk(c)
			errs := c.validate()
			if len(errs) == 0 {
				t.Fatal("not detected")
			}
			t.Logf("detected: %v", errs[0])
		})
	}
}

// binary builds cmd/warmroute once per test run (or returns the build
// WARMROUTE_E2E_BIN names, as `make test` sets).
var binary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "warmroute-deploy-test-")
	if err != nil {
		return "", err
	}
	binDir = dir
	return proc.Binary(dir)
})

// binDir is the directory binary built in, removed after the tests.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	// Only a test that asked for the binary built it; asking here would
	// build it just to remove it.
	if built.Load() {
		if _, err := binary(); err == nil {
			os.RemoveAll(binDir)
		}
	}
	os.Exit(code)
}

// built records whether a test asked for the binary, so TestMain does not
// build it only to remove it.
var built atomic.Bool

func warmrouteBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() && os.Getenv(proc.BinaryEnv) == "" {
		t.Skip("builds cmd/warmroute; skipped with -short unless " + proc.BinaryEnv + " names a build")
	}
	built.Store(true)
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

var flagLine = regexp.MustCompile(`^\s+-([a-zA-Z][a-zA-Z0-9-]*)`)

// serveFlags returns the flag names `warmroute serve --help` lists.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := warmrouteBinary(t)
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput() // --help exits non-zero
	flags := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := flagLine.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if !flags["listen"] || !flags["backends"] {
		t.Fatalf("could not read the flags of warmroute serve --help:\n%s", out)
	}
	return flags
}

// envOnly are WARMROUTE_* variables that are not flags.
var envOnly = map[string]bool{"WARMROUTE_GOSSIP_KEY": true, "WARMROUTE_ADMIN_TOKEN": true}

// checkEnvNames reports WARMROUTE_* variables that name no serve flag.
func checkEnvNames(t *testing.T, where string, names []string) {
	t.Helper()
	for _, err := range envNameErrors(serveFlags(t), names) {
		t.Errorf("%s: %v", where, err)
	}
}

func envNameErrors(flags map[string]bool, names []string) (errs []error) {
	for _, n := range names {
		if !strings.HasPrefix(n, "WARMROUTE_") || envOnly[n] {
			continue
		}
		flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(n, "WARMROUTE_")), "_", "-")
		if !flags[flag] {
			errs = append(errs, fmt.Errorf("%s matches no flag of warmroute serve (--%s); it would be ignored", n, flag))
		}
	}
	return errs
}

func TestEnvNameCheckCatchesTypos(t *testing.T) {
	flags := map[string]bool{"prefix-length": true, "listen": true}
	errs := envNameErrors(flags, []string{"WARMROUTE_PREFIX_LENGTH", "WARMROUTE_PREFIX_LENGHT", "WARMROUTE_GOSSIP_KEY", "OTHER"})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "WARMROUTE_PREFIX_LENGHT") {
		t.Errorf("errors %v: want one, for WARMROUTE_PREFIX_LENGHT", errs)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// poll calls f until it returns nil or the deadline passes.
func poll(t *testing.T, what string, d time.Duration, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s: %v", what, d, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
