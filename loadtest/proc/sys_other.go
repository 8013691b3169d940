//go:build !unix

package proc

import (
	"errors"
	"os/exec"
)

// Without process groups or job-control signals, Stop and Kill end the
// child alone and Pause is not supported.
func prepare(*exec.Cmd, int) {}

func terminate(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
func kill(cmd *exec.Cmd)      { _ = cmd.Process.Kill() }
func quit(*exec.Cmd)          {}
func pause(*exec.Cmd) error   { return errors.ErrUnsupported }
func resume(*exec.Cmd) error  { return nil }
