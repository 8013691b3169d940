//go:build linux

package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// DeferredWrite saves two system calls per exchange on a connection where
// a request is written and then its answer read. Go's net package writes,
// then reads, gets EAGAIN (the answer is not there yet), parks, and reads
// again when the poller says so: a write and two reads. Here the last write
// of a request is held back and made inside the first read's
// syscall.RawConn callback, which runs after the poller was armed: the
// callback writes and returns false, so the runtime waits for readiness
// without a read that cannot succeed; the next call reads the answer. An
// answer arriving after the write is an edge the armed poller sees, so none
// is lost.
//
// This relies on nothing being readable before the request is written,
// which holds for HTTP/1.1 upstreams: a server does not speak first, a
// pooled connection is checked with PeerClosed before reuse, and a close
// racing that check makes the write fail or the peer reset, which wakes
// the poller. The wait is bounded by the read deadline regardless.
//
// Held bytes are copied (callers reuse their buffers). A write while bytes
// are held sends them first, so order is kept. The embedded Socket gives
// the rest (deadlines, PeerClosed, OnBlock); its own Read and Write bypass
// the held bytes. A DeferredWrite belongs to the one goroutine that reads
// and writes its connection.
type DeferredWrite struct {
	*Socket
	held    []byte
	off     int  // held[:off] is sent
	blocked bool // the held bytes did not fit the socket buffer
	heldCB  func(uintptr) bool
}

// NewDeferredWrite returns nil when c has no raw file descriptor. A write
// that cannot go out for writeStall (the peer does not read) fails.
func NewDeferredWrite(c net.Conn, writeStall time.Duration) *DeferredWrite {
	s := NewSocket(c, writeStall)
	if s == nil {
		return nil
	}
	d := &DeferredWrite{Socket: s}
	d.heldCB = d.rawHeld
	return d
}

// maxHeld bounds what is held back; larger writes go out at once, so a
// connection never keeps a large buffer.
const maxHeld = 64 << 10

func (d *DeferredWrite) pending() bool { return d.off < len(d.held) }

// Write holds p back to be written with the next Read. Bytes still held
// from before go out first, and p goes out at once when it is larger than
// 64 KiB.
func (d *DeferredWrite) Write(p []byte) (int, error) {
	if err := d.flush(); err != nil {
		return 0, err
	}
	if len(p) > maxHeld {
		return d.Socket.Write(p)
	}
	d.held = append(d.held[:0], p...)
	d.off = 0
	return len(p), nil
}

// flush writes the held bytes now.
func (d *DeferredWrite) flush() error {
	if !d.pending() {
		return nil
	}
	n, err := d.Socket.Write(d.held[d.off:])
	d.off += n
	if err == nil {
		d.held, d.off = d.held[:0], 0
	}
	return err
}

// Read writes the held bytes and reads into p, with the semantics of
// net.Conn.Read.
func (d *DeferredWrite) Read(p []byte) (int, error) {
	if !d.pending() || len(p) == 0 {
		return d.Socket.Read(p)
	}
	d.p, d.n, d.err, d.blocked = p, 0, nil, false
	err := d.rc.Read(d.heldCB)
	d.p = nil
	if err == nil {
		err = d.err
	}
	if err != nil {
		return 0, d.opError("read", err)
	}
	if d.blocked {
		// The socket buffer is full: finish the write the ordinary way.
		if err := d.flush(); err != nil {
			return 0, err
		}
		return d.Socket.Read(p)
	}
	if d.n == 0 {
		return 0, io.EOF
	}
	return d.n, nil
}

// rawHeld runs with the poller armed for reading. The first call writes
// what is held and asks to wait; later calls read.
func (d *DeferredWrite) rawHeld(fd uintptr) bool {
	if d.pending() {
		for d.pending() {
			n, e := sysWrite(fd, d.held[d.off:])
			switch e {
			case 0:
				d.off += n
			case syscall.EAGAIN:
				d.blocked = true
				return true
			default:
				d.err = os.NewSyscallError("write", e)
				return true
			}
		}
		d.held, d.off = d.held[:0], 0
		return d.armRead()
	}
	return d.rawRead(fd)
}
