//go:build !linux

package chaos

import (
	"fmt"
	"os/exec"
	"syscall"
)

const (
	sigKill = syscall.Signal(9)
	sigTerm = syscall.Signal(15)
	sigStop = syscall.Signal(19)
	sigCont = syscall.Signal(18)
)

func localSupported() error {
	return fmt.Errorf("%w: the local target runs on Linux only (use the compose target)", ErrUnsupported)
}

func prepareCmd(*exec.Cmd, int) {}

func signalGroup(*exec.Cmd, syscall.Signal) {}

type firewall struct{}

func newFirewall(string) (*firewall, error) { return nil, ErrUnsupported }

func (*firewall) block([][]string) error { return ErrUnsupported }
func (*firewall) clear() error           { return nil }
func (*firewall) close() error           { return nil }
