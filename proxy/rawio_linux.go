//go:build linux

package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// rawSocket does a TCP connection's reads and writes itself, through
// syscall.RawConn callbacks, with raw system calls. Go's net package enters
// the scheduler's syscall state around every read and write; with one
// thread per core (GOMAXPROCS 1 on a pinned process) the runtime's monitor
// then hands the processor to another thread whenever a loopback write
// takes a little long, and threads wake each other several times per
// request. Socket I/O here is non-blocking and never sleeps in the kernel
// (the wait for readiness is the runtime poller's, as in the net package),
// so raw calls are safe and keep the request on one thread. Deadlines set on
// the connection apply as usual: the poller's wait honours them.
//
// The callbacks are method values bound once, so reads and writes allocate
// nothing. A rawSocket belongs to the one goroutine that reads and writes
// its connection.
type rawSocket struct {
	conn net.Conn
	rc   syscall.RawConn

	// Callback arguments and results.
	p                      []byte
	n                      int
	err                    error
	closed                 bool
	wouldBlock             bool
	readCB, writeCB, tryCB func(uintptr) bool
	peekCB                 func(uintptr)

	// onBlock, when set, runs once before a read waits for data.
	onBlock func()

	// writeStall, when positive, bounds how long a write may wait for
	// room in a full socket buffer without any byte going out (a peer
	// that stopped reading). A write that never waits pays nothing.
	writeStall time.Duration
	armed      bool // a write deadline is set for the current write
	mark       int  // bytes written when it was set
	stallCB    func(uintptr) bool

	// The read deadline, which reaches the runtime poller lazily (see
	// setReadDeadline): rdWant is the deadline asked for, rdDur how far
	// ahead of the moment it was asked it lay, rdSet what the poller holds
	// (unix nanoseconds; 0 for none). rdDirty says the poller was set
	// behind the socket's back, from another goroutine, so rdSet is stale.
	rdWant, rdDur, rdSet int64
	rdDirty              atomic.Bool
	rdApplied            int // times the poller's read deadline was set (for tests)
}

// rdMargin is how close to lapsing a poller deadline may be when a new one
// is asked for and not applied at once; see setReadDeadline.
const rdMargin = int64(time.Second)

// setReadDeadline is net.Conn.SetReadDeadline for the goroutine that reads
// the connection. Changing the runtime poller's deadline costs a timer
// update (and a clock read), and servers move it twice per request (idle,
// then reading) where the read hardly ever waits. So the deadline asked
// for is only recorded, and applied when a read is about to wait
// (armRead); a read that finds data at once does not look at it. Two
// cases apply at once: a deadline already past (an interrupt: reads must
// fail now), and a poller deadline that would lapse within rdMargin, since
// the poller fails a read whose deadline lapsed even when data is there.
// Before a wait, a deadline later than the poller's by at most 1/64 of its
// length is not moved either (see armRead): a wait may end that much early.
// The deadline and the time are in unix nanoseconds; want 0 is none.
func (s *rawSocket) setReadDeadline(want, now int64) error {
	s.rdWant, s.rdDur = want, 0
	if want != 0 {
		s.rdDur = want - now
	}
	s.forgetIfChanged()
	if (want != 0 && want <= now) || (s.rdSet != 0 && s.rdSet-now < rdMargin) {
		return s.applyReadDeadline()
	}
	return nil
}

// pollerChanged records that the poller's read deadline was set directly
// (by the connection's owner or from another goroutine).
func (s *rawSocket) pollerChanged() { s.rdDirty.Store(true) }

// forgetIfChanged marks rdSet unknown after pollerChanged, so the next
// deadline is applied. The plain load first keeps the common case (never
// changed behind its back) free of a locked instruction.
func (s *rawSocket) forgetIfChanged() {
	if s.rdDirty.Load() && s.rdDirty.Swap(false) {
		s.rdSet = -1
	}
}

// applyReadDeadline hands the recorded deadline to the poller.
func (s *rawSocket) applyReadDeadline() error {
	var t time.Time
	if s.rdWant != 0 {
		t = time.Unix(0, s.rdWant)
	}
	if err := s.conn.SetReadDeadline(t); err != nil {
		s.rdSet = -1
		return err
	}
	s.rdSet = s.rdWant
	s.rdApplied++
	return nil
}

// armRead runs in a read callback that is about to wait: it brings the
// poller's deadline up to date. It returns true, with s.err set, if that
// failed, and false (wait) otherwise.
func (s *rawSocket) armRead() bool {
	s.forgetIfChanged()
	if s.rdWant == s.rdSet {
		return false
	}
	if s.rdSet > 0 && s.rdWant > s.rdSet && s.rdWant-s.rdSet <= s.rdDur>>6 {
		return false
	}
	if err := s.applyReadDeadline(); err != nil {
		s.err = err
		return true
	}
	return false
}

func newRawSocket(c net.Conn) *rawSocket {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &rawSocket{conn: c, rc: rc}
	s.readCB, s.writeCB, s.peekCB, s.tryCB = s.rawRead, s.rawWrite, s.rawPeek, s.rawTry
	s.stallCB = s.rawWriteStall
	return s
}

// sysRead and sysWrite are recv and send (recvfrom and sendto without an
// address), not read and write: on a socket those skip the file layer's
// descriptor-position lock, VFS dispatch and user-copy checks, which took
// about 0.7 us per request over loopback (perf, against HAProxy, which
// uses recvfrom and sendto too). MSG_NOSIGNAL: a send to a connection the
// peer reset fails with EPIPE without raising SIGPIPE.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), 0, 0, 0)
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), syscall.MSG_NOSIGNAL, 0, 0)
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

func (s *rawSocket) rawRead(fd uintptr) bool {
	n, e := sysRead(fd, s.p)
	switch e {
	case 0:
		s.n = n
	case syscall.EAGAIN:
		return s.armRead()
	default:
		s.err = os.NewSyscallError("read", e)
	}
	return true
}

func (s *rawSocket) rawWrite(fd uintptr) bool {
	for s.n < len(s.p) {
		n, e := sysWrite(fd, s.p[s.n:])
		switch e {
		case 0:
			s.n += n
		case syscall.EAGAIN:
			return false
		default:
			s.err = os.NewSyscallError("write", e)
			return true
		}
	}
	return true
}

// rawWriteStall is rawWrite for a socket with a writeStall: when the
// buffer is full it asks write (through wouldBlock) to set or move the
// write deadline before waiting, unless the deadline is set and nothing
// went out since.
func (s *rawSocket) rawWriteStall(fd uintptr) bool {
	for s.n < len(s.p) {
		n, e := sysWrite(fd, s.p[s.n:])
		switch e {
		case 0:
			s.n += n
		case syscall.EAGAIN:
			if !s.armed || s.n > s.mark {
				s.wouldBlock = true
				return true
			}
			return false
		default:
			s.err = os.NewSyscallError("write", e)
			return true
		}
	}
	return true
}

// rawTry is rawRead that reports, instead of waiting, that it would.
func (s *rawSocket) rawTry(fd uintptr) bool {
	if !s.rawRead(fd) {
		s.wouldBlock = true
	}
	return true
}

// read is net.Conn.Read.
func (s *rawSocket) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.p, s.n, s.err = p, 0, nil
	cb := s.readCB
	if s.onBlock != nil {
		s.wouldBlock = false
		cb = s.tryCB
	}
	err := s.rc.Read(cb)
	if err == nil && s.wouldBlock {
		f := s.onBlock
		s.onBlock, s.wouldBlock = nil, false
		f()
		err = s.rc.Read(s.readCB)
	}
	s.p = nil
	if err == nil {
		err = s.err
	}
	if err != nil {
		return 0, s.opError("read", err)
	}
	if s.n == 0 {
		return 0, io.EOF
	}
	return s.n, nil
}

// write is net.Conn.Write.
func (s *rawSocket) write(p []byte) (int, error) {
	s.p, s.n, s.err = p, 0, nil
	var err error
	if s.writeStall <= 0 {
		err = s.rc.Write(s.writeCB)
	} else {
		err = s.writeStalled()
	}
	s.p = nil
	if err == nil {
		err = s.err
	}
	if err != nil {
		return s.n, s.opError("write", err)
	}
	return s.n, nil
}

// writeStalled writes s.p allowing writeStall without progress each time
// the socket buffer is full.
func (s *rawSocket) writeStalled() error {
	s.armed, s.wouldBlock = false, false
	err := s.rc.Write(s.stallCB)
	for err == nil && s.err == nil && s.wouldBlock {
		s.wouldBlock = false
		if err = s.conn.SetWriteDeadline(time.Now().Add(s.writeStall)); err != nil {
			break
		}
		s.armed, s.mark = true, s.n
		err = s.rc.Write(s.stallCB)
	}
	if s.armed {
		s.armed = false
		if derr := s.conn.SetWriteDeadline(time.Time{}); err == nil && s.err == nil {
			err = derr
		}
	}
	return err
}

// peerClosed reports whether the peer closed an idle connection (EOF or
// reset pending, or unexpected bytes waiting), with one non-blocking
// MSG_PEEK recv. It runs through Control, not Read: Read refuses to call
// back once the connection's last read deadline has passed (a health
// probe's short one, typically), and the check would then pass a closed
// connection as alive. A connection whose descriptor is gone counts as
// closed.
func (s *rawSocket) peerClosed() bool {
	s.closed = false
	if err := s.rc.Control(s.peekCB); err != nil {
		return true
	}
	return s.closed
}

func (s *rawSocket) rawPeek(fd uintptr) {
	var buf [1]byte
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	// EAGAIN: alive and quiet. Any other error: reset. No error: EOF (0
	// bytes) or bytes nobody asked for; either way not reusable.
	s.closed = e != syscall.EAGAIN && e != syscall.EWOULDBLOCK
}

func (s *rawSocket) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.conn.LocalAddr(), Addr: s.conn.RemoteAddr(), Err: err}
}

// rawConn is a client connection whose reads and writes go through a
// rawSocket.
//
// For a streamed answer it can hold the headers back (holdHeaders): when
// the engine sent its headers together with the first event, both go out in
// one write, so the client wakes once for them; when the upstream read for
// the first event would wait (the engine sent its headers first, as vLLM
// does, and is still prefilling), the headers go out before it waits, as
// they did before.
type rawConn struct {
	net.Conn
	s *rawSocket

	clientClose
	firstHead

	hold    bool       // the next write goes out together with held
	held    []byte     // headers held back
	heldErr error      // a failed write of held, returned by the next write
	up      *rawSocket // the upstream whose blocking read flushes held
	flushFn func()     // flushHeld, bound once
}

// newRawConn wraps a client connection: writes that stall longer than
// writeStall fail, and Close counts it closed in open and, when asked,
// lingers with linger (see clientClose). A connection without a raw
// descriptor gets the portable wrapper.
func newRawConn(c net.Conn, writeStall time.Duration, open *atomic.Int64, linger func(net.Conn)) net.Conn {
	s := newRawSocket(c)
	if s == nil {
		return newCountedConn(c, writeStall, open, linger)
	}
	s.writeStall = writeStall
	rc := &rawConn{Conn: c, s: s, clientClose: clientClose{open: open, linger: linger}}
	rc.flushFn = rc.flushHeld
	return rc
}

// Close closes the connection (see clientClose).
func (c *rawConn) Close() error { return c.clientClose.close(c.Conn) }

// SetReadDeadline records the deadline; it reaches the poller when a read
// waits (see rawSocket.setReadDeadline).
func (c *rawConn) SetReadDeadline(t time.Time) error {
	return c.s.setReadDeadline(deadlineNanos(t), time.Now().UnixNano())
}

// SetDeadline is SetReadDeadline plus the write deadline.
func (c *rawConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.s.setReadDeadline(deadlineNanos(t), time.Now().UnixNano())
}

func (c *rawConn) Read(p []byte) (int, error) {
	c.flushHeld()
	if c.done {
		if c.err != nil {
			return 0, c.err
		}
		return c.s.read(p)
	}
	n, err := c.s.read(p)
	c.inspect(p[:n])
	return n, err
}

func (c *rawConn) Write(p []byte) (int, error) {
	if c.heldErr != nil {
		err := c.heldErr
		c.heldErr = nil
		return 0, err
	}
	if !c.hold {
		return c.s.write(p)
	}
	if len(c.held) == 0 {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	// The first body bytes: out with the headers, in one write.
	c.stopHolding()
	first := len(c.held)
	c.held = append(c.held, p...)
	n, err := c.s.write(c.held)
	c.held = c.held[:0]
	return max(0, n-first), err
}

// holdHeaders holds the next write (the answer's headers) until the one
// after it, or until a read on up would wait.
func (c *rawConn) holdHeaders(up *rawSocket) {
	c.hold, c.up = true, up
	up.onBlock = c.flushFn
}

func (c *rawConn) stopHolding() {
	c.hold = false
	if c.up != nil {
		c.up.onBlock = nil
		c.up = nil
	}
}

// flushHeld sends the held headers now.
func (c *rawConn) flushHeld() {
	c.stopHolding()
	if len(c.held) == 0 {
		return
	}
	if _, err := c.s.write(c.held); err != nil {
		c.heldErr = err
	}
	c.held = c.held[:0]
}

// releaseHold ends holding for a stream that is over; nil-safe.
func (c *rawConn) releaseHold() {
	if c != nil {
		c.flushHeld()
	}
}

// holdStreamHeaders makes client hold a streamed answer's headers until its
// first body bytes (see rawConn), when both ends are raw connections. laddr
// is the upstream response's LocalAddr, which names the connection it came
// on. It returns the client connection to release when the stream ends, or
// nil.
func holdStreamHeaders(client net.Conn, laddr net.Addr) *rawConn {
	rc, ok := client.(*rawConn)
	if !ok {
		return nil
	}
	a, ok := laddr.(*upstreamAddr)
	if !ok || a.c.d == nil {
		return nil
	}
	rc.holdHeaders(a.c.d.rawSocket)
	return rc
}

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
	*rawSocket
	held    []byte
	off     int  // held[:off] is sent
	blocked bool // the held bytes did not fit the socket buffer
	heldCB  func(uintptr) bool
}

// newDeferredWrite returns nil when c has no raw file descriptor. A write
// that cannot go out for writeStall (the backend does not read) fails.
func newDeferredWrite(c net.Conn, writeStall time.Duration) *deferredWrite {
	s := newRawSocket(c)
	if s == nil {
		return nil
	}
	s.writeStall = writeStall
	d := &deferredWrite{rawSocket: s}
	d.heldCB = d.rawHeld
	return d
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
		return d.rawSocket.write(p)
	}
	d.held = append(d.held[:0], p...)
	d.off = 0
	return len(p), nil
}

// flush writes the held bytes now.
func (d *deferredWrite) flush() error {
	if !d.pending() {
		return nil
	}
	n, err := d.rawSocket.write(d.held[d.off:])
	d.off += n
	if err == nil {
		d.held, d.off = d.held[:0], 0
	}
	return err
}

// read writes the held bytes and reads into p, with the semantics of
// net.Conn.Read.
func (d *deferredWrite) read(p []byte) (int, error) {
	if !d.pending() || len(p) == 0 {
		return d.rawSocket.read(p)
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
		return d.rawSocket.read(p)
	}
	if d.n == 0 {
		return 0, io.EOF
	}
	return d.n, nil
}

// rawHeld runs with the poller armed for reading. The first call writes
// what is held and asks to wait; later calls read.
func (d *deferredWrite) rawHeld(fd uintptr) bool {
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
