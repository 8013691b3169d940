package fleet

import (
	"os/exec"
	"syscall"
)

// prepare puts the child in its own process group and has the kernel kill
// it if the parent dies.
func prepare(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
