//go:build unix && !linux

package fleet

import (
	"os/exec"
	"syscall"
)

// prepare puts the child in its own process group.
func prepare(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
