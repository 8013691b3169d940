//go:build unix

package proc

import (
	"os/exec"
	"syscall"
)

// signalGroup sends sig to the child's process group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}

func terminate(cmd *exec.Cmd) { _ = signalGroup(cmd, syscall.SIGTERM) }
func kill(cmd *exec.Cmd)      { _ = signalGroup(cmd, syscall.SIGKILL) }

// quit sends SIGQUIT to the child alone: a Go program prints the stacks
// of all its goroutines and exits.
func quit(cmd *exec.Cmd) { _ = cmd.Process.Signal(syscall.SIGQUIT) }
func pause(cmd *exec.Cmd) error {
	return signalGroup(cmd, syscall.SIGSTOP)
}
func resume(cmd *exec.Cmd) error { return signalGroup(cmd, syscall.SIGCONT) }

// credential runs the child as uid (and gid uid) when uid > 0.
func credential(attr *syscall.SysProcAttr, uid int) {
	if uid > 0 {
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), NoSetGroups: true}
	}
}
