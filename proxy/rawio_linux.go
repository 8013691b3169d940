//go:build unix

package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// deferredWrite saves two system calls per exchange on an upstream
// connection, where a request is written and then its answer read. Go's
// net package writes, then reads, gets EAGAIN (the answer is not there
// yet), parks, and reads again when the poller says so: a write and two
// reads. Here the last write of a request is held back and made inside
// the first read's syscall.RawConn callback, which runs after the poller
// was armed: the callback writes and returns false, so the runtime waits
// for readiness without a read that cannot succeed; the next call reads
// the answer. An answer arriving after the write is an edge the armed
// poller sees, so none is lost.
//
// This relies on nothing being readable before the request is written,
// which holds for HTTP/1.1 upstreams: a server does not speak first, a
// pooled connection is checked with peerClosed before reuse, and a close
// racing that check makes the write fail or the peer reset, which wakes
// the poller. The wait is bounded by the read deadline regardless.
//
// Held bytes are copied (callers reuse their buffers). A write while bytes
// are held sends them first, so order is kept. A deferredWrite belongs to
// the one goroutine that reads and writes its connection.
type deferredWrite struct {
	conn net.Conn
	rc   syscall.RawConn
	held []byte
	off  int // held[:off] is sent

	// The raw callback's arguments and results.
	p       []byte
	n       int
	err     error
	blocked bool // the held bytes did not fit the socket buffer
	closed  bool // peek's result
	cb      func(uintptr) bool
	peekCB  func(uintptr) bool
}

// newDeferredWrite returns nil when c has no raw file descriptor.
func newDeferredWrite(c net.Conn) *deferredWrite {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	d := &deferredWrite{conn: c, rc: rc}
	d.cb, d.peekCB = d.raw, d.peek
	return d
}

// peerClosed reports whether the peer closed an idle connection (EOF or
// reset pending, or unexpected bytes waiting), with one non-blocking
// MSG_PEEK recv.
func (d *deferredWrite) peerClosed() bool {
	d.closed = false
	err := d.rc.Read(d.peekCB)
	return err == nil && d.closed
}

func (d *deferredWrite) peek(fd uintptr) bool {
	var buf [1]byte
	_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	// EAGAIN: alive and quiet. Any other error: reset. No error: EOF (0
	// bytes) or bytes nobody asked for; either way not reusable.
	d.closed = !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
	return true
}

// maxHeld bounds what is held back; larger writes go out at once, so a
// connection never keeps a large buffer.
const maxHeld = 64 << 10

func (d *deferredWrite) pending() bool { return d.off < len(d.held) }

// write holds p back to be written with the next read.
func (d *deferredWrite) write(p []byte) (int, error) {
	if err := d.flush(); err != nil {
		return 0, err
	}
	if len(p) > maxHeld {
		return d.conn.Write(p)
	}
	d.held = append(d.held[:0], p...)
	d.off = 0
	return len(p), nil
}

// flush writes the held bytes now, blocking as net.Conn.Write does.
func (d *deferredWrite) flush() error {
	if !d.pending() {
		return nil
	}
	n, err := d.conn.Write(d.held[d.off:])
	d.off += n
	if err == nil {
		d.held, d.off = d.held[:0], 0
	}
	return err
}

// read writes the held bytes and reads into p, with the semantics of
// net.Conn.Read (deadlines included: the runtime's wait honours them).
func (d *deferredWrite) read(p []byte) (int, error) {
	if !d.pending() || len(p) == 0 {
		return d.conn.Read(p)
	}
	d.p, d.n, d.err, d.blocked = p, 0, nil, false
	err := d.rc.Read(d.cb)
	d.p = nil
	if err != nil {
		return 0, d.opError(err)
	}
	if d.blocked {
		// The socket buffer is full: finish the write the ordinary way.
		if err := d.flush(); err != nil {
			return 0, err
		}
		return d.conn.Read(p)
	}
	if d.err != nil {
		return 0, d.opError(d.err)
	}
	if d.n == 0 {
		return 0, io.EOF
	}
	return d.n, nil
}

// raw runs with the poller armed for reading. The first call writes what
// is held and asks to wait; later calls read.
func (d *deferredWrite) raw(fd uintptr) bool {
	if d.pending() {
		for d.pending() {
			n, err := syscall.Write(int(fd), d.held[d.off:])
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				d.blocked = true
				return true
			case err != nil:
				d.err = os.NewSyscallError("write", err)
				return true
			}
			d.off += n
		}
		d.held, d.off = d.held[:0], 0
		return false
	}
	for {
		n, err := syscall.Read(int(fd), d.p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false
		case err != nil:
			d.err = os.NewSyscallError("read", err)
			return true
		}
		d.n = n
		return true
	}
}

func (d *deferredWrite) opError(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: "read", Net: "tcp", Source: d.conn.LocalAddr(), Addr: d.conn.RemoteAddr(), Err: err}
}
