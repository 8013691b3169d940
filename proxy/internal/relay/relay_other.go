//go:build !linux

package relay

import (
	"context"
	"net"
)

// Relay is not available on this platform; New returns nil.
type Relay struct{}

// New returns nil: the platform has no event loops here.
func New(Config) *Relay { return nil }

// Start is not reached (New returned nil).
func (r *Relay) Start(Spec) error { return ErrUnsupported }

// Active returns 0.
func (r *Relay) Active() int { return 0 }

// Wait returns at once.
func (r *Relay) Wait(context.Context) error { return nil }

// Close does nothing.
func (r *Relay) Close() {}

// Detach is not supported here.
func Detach(net.Conn) (int, error) { return -1, ErrUnsupported }

// CloseFD is not supported here.
func CloseFD(int) {}

// Resume is not reached (New returned nil).
func Resume(int) net.Conn { return nil }

// ResumeClient is not reached (New returned nil).
func ResumeClient(int, net.Addr, net.Addr) net.Conn { return nil }

// Quiet is not supported here: false.
func Quiet(int) bool { return false }
