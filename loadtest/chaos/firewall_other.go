//go:build !linux

package chaos

import "fmt"

func localSupported() error {
	return fmt.Errorf("%w: the local target runs on Linux only (use the compose target)", ErrUnsupported)
}

type firewall struct{}

func newFirewall(string) (*firewall, error) { return nil, ErrUnsupported }

func (*firewall) block([][]string) error { return ErrUnsupported }
func (*firewall) clear() error           { return nil }
func (*firewall) close() error           { return nil }
