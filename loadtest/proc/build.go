package proc

import (
	"fmt"
	"os"
	"os/exec"
)

// Build compiles the main package pkg (an import path, or a directory such
// as ".") into the executable out with `go build`, cgo off, for the
// end-to-end tests that run the real binary.
func Build(pkg, out string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// BinaryEnv names the environment variable that points the end-to-end tests
// at an already built warmroute binary; `make test` builds it once and sets
// it for every package, so no test package builds its own.
const BinaryEnv = "WARMROUTE_E2E_BIN"

// Binary returns the warmroute executable the end-to-end tests run: the
// one BinaryEnv names when set, else a fresh build of cmd/warmroute in dir.
func Binary(dir string) (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", BinaryEnv, err)
		}
		return p, nil
	}
	out := dir + string(os.PathSeparator) + "warmroute"
	return out, Build("github.com/warmroute/warmroute/cmd/warmroute", out)
}
