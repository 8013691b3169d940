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
