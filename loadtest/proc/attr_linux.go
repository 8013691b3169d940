package proc

import (
	"os/exec"
	"syscall"
)

// prepare puts the child in its own process group, has the kernel kill it
// if this process dies, and runs it as uid when uid > 0.
func prepare(cmd *exec.Cmd, uid int) {
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	credential(attr, uid)
	cmd.SysProcAttr = attr
}
