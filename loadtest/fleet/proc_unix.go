//go:build unix

package fleet

import (
	"os/exec"
	"syscall"
)

// terminate asks the child's process group to stop.
func terminate(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }

// kill stops the child's process group at once.
func kill(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
