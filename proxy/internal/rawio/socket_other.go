//go:build !linux

package rawio

import (
	"errors"
	"net"
	"time"
)

// Raw socket I/O is implemented on Linux only. Elsewhere NewSocket and
// NewDeferredWrite return nil and callers use their connections as they
// are; the methods exist so that callers compile, and report
// errors.ErrUnsupported.

// Socket is not available on this platform (see NewSocket).
type Socket struct{}

// NewSocket returns nil: no raw socket I/O on this platform.
func NewSocket(net.Conn, time.Duration) *Socket { return nil }

// Read reports errors.ErrUnsupported.
func (*Socket) Read([]byte) (int, error) { return 0, errors.ErrUnsupported }

// Write reports errors.ErrUnsupported.
func (*Socket) Write([]byte) (int, error) { return 0, errors.ErrUnsupported }

// SetReadDeadline reports errors.ErrUnsupported.
func (*Socket) SetReadDeadline(_, _ int64) error { return errors.ErrUnsupported }

// PollerChanged does nothing.
func (*Socket) PollerChanged() {}

// OnBlock does nothing.
func (*Socket) OnBlock(func()) {}

// PeerClosed reports false.
func (*Socket) PeerClosed() bool { return false }

// DeferredWrite is not available on this platform (see NewDeferredWrite).
type DeferredWrite struct{ *Socket }

// NewDeferredWrite returns nil: no raw socket I/O on this platform.
func NewDeferredWrite(net.Conn, time.Duration) *DeferredWrite { return nil }
