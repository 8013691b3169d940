//go:build unix && !linux

package proc

import (
	"os/exec"
	"syscall"
)

// prepare puts the child in its own process group and runs it as uid when
// uid > 0. Nothing here makes it die with its parent: Stop does.
func prepare(cmd *exec.Cmd, uid int) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	credential(attr, uid)
	cmd.SysProcAttr = attr
}
