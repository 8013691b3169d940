//go:build linux

package rawio

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

// Socket does a TCP connection's reads and writes with raw system calls
// (see the package documentation). Deadlines set on the connection apply as
// usual: the poller's wait honours them.
type Socket struct {
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

	// The read deadline, which reaches the runtime poller lazily (see
	// SetReadDeadline): rdWant is the deadline asked for, rdDur how far
	// ahead of the moment it was asked it lay, rdSet what the poller holds
	// (unix nanoseconds; 0 for none). rdDirty says the poller was set
	// behind the socket's back, from another goroutine, so rdSet is stale.
	rdWant, rdDur, rdSet int64
	rdDirty              atomic.Bool
	rdApplied            int // times the poller's read deadline was set (for tests)
}

// NewSocket returns a Socket doing c's reads and writes, or nil when c has
// no raw file descriptor. A write that cannot go out for writeStall (the
// peer stopped reading) fails; 0 is no bound. c's read deadline must be set
// through the Socket from then on (see SetReadDeadline).
func NewSocket(c net.Conn, writeStall time.Duration) *Socket {
	rc := syscallConn(c)
	if rc == nil {
		return nil
	}
	s := &Socket{conn: c, rc: rc, writeStall: writeStall}
	s.readCB, s.writeCB, s.peekCB, s.tryCB = s.rawRead, s.rawWrite, s.rawPeek, s.rawTry
	return s
}

// rdMargin is how close to lapsing a poller deadline may be when a new one
// is asked for and not applied at once; see SetReadDeadline.
const rdMargin = int64(time.Second)

// SetReadDeadline is net.Conn.SetReadDeadline for the goroutine that reads
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
func (s *Socket) SetReadDeadline(want, now int64) error {
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

// PollerChanged records that the poller's read deadline was set directly
// on the connection (by its owner, or from another goroutine to interrupt a
// read), so the next deadline asked for is applied. Any goroutine may call
// it.
func (s *Socket) PollerChanged() { s.rdDirty.Store(true) }

// forgetIfChanged marks rdSet unknown after PollerChanged, so the next
// deadline is applied. The plain load first keeps the common case (never
// changed behind its back) free of a locked instruction.
func (s *Socket) forgetIfChanged() {
	if s.rdDirty.Load() && s.rdDirty.Swap(false) {
		s.rdSet = -1
	}
}

// applyReadDeadline hands the recorded deadline to the poller.
func (s *Socket) applyReadDeadline() error {
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
func (s *Socket) armRead() bool {
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

// OnBlock sets f to run once, before the next read that has to wait for
// data waits; nil clears it. A read that finds data at once leaves it set.
// f runs on the reading goroutine and must not use this Socket.
func (s *Socket) OnBlock(f func()) { s.onBlock = f }

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

func (s *Socket) rawRead(fd uintptr) bool {
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

// rawWrite sends what is left of s.p. When the buffer is full it waits,
// or, on a socket with a writeStall, first asks writeStalled (through
// wouldBlock) to set or move the write deadline, unless the deadline is
// set and nothing went out since.
func (s *Socket) rawWrite(fd uintptr) bool {
	for s.n < len(s.p) {
		n, e := sysWrite(fd, s.p[s.n:])
		switch e {
		case 0:
			s.n += n
		case syscall.EAGAIN:
			if s.writeStall > 0 && (!s.armed || s.n > s.mark) {
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
func (s *Socket) rawTry(fd uintptr) bool {
	if !s.rawRead(fd) {
		s.wouldBlock = true
	}
	return true
}

// Read is net.Conn.Read.
func (s *Socket) Read(p []byte) (int, error) {
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

// Write is net.Conn.Write.
func (s *Socket) Write(p []byte) (int, error) {
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
func (s *Socket) writeStalled() error {
	s.armed, s.wouldBlock = false, false
	err := s.rc.Write(s.writeCB)
	for err == nil && s.err == nil && s.wouldBlock {
		s.wouldBlock = false
		if err = s.conn.SetWriteDeadline(time.Now().Add(s.writeStall)); err != nil {
			break
		}
		s.armed, s.mark = true, s.n
		err = s.rc.Write(s.writeCB)
	}
	if s.armed {
		s.armed = false
		if derr := s.conn.SetWriteDeadline(time.Time{}); err == nil && s.err == nil {
			err = derr
		}
	}
	return err
}

// PeerClosed reports whether the peer closed an idle connection (EOF or
// reset pending, or unexpected bytes waiting), with one non-blocking
// MSG_PEEK recv, without allocating. It runs through Control, not Read:
// Read refuses to call back once the connection's last read deadline has
// passed (a health probe's short one, typically), and the check would then
// pass a closed connection as alive. A connection whose descriptor is gone
// counts as closed.
func (s *Socket) PeerClosed() bool {
	s.closed = false
	if err := s.rc.Control(s.peekCB); err != nil {
		return true
	}
	return s.closed
}

func (s *Socket) rawPeek(fd uintptr) {
	var buf [1]byte
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	s.closed = peekSaysClosed(e)
}

func (s *Socket) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.conn.LocalAddr(), Addr: s.conn.RemoteAddr(), Err: err}
}
