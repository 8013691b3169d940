//go:build linux

package relay

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// bufSize is a loop's read buffer: what one read of one upstream may
	// take (an event is a few hundred bytes; a burst of them fits).
	bufSize = 64 << 10
	// maxEvents is what one epoll_wait may return.
	maxEvents = 256
	// sweepEvery is how often the loop checks its streams' timeouts.
	sweepEvery = 250 * time.Millisecond
	// wakeSlot marks the loop's eventfd in epoll data.
	wakeSlot = -1
)

// Relay runs the event loops. Its methods are safe for concurrent use.
type Relay struct {
	cfg    Config
	start  sync.Once
	loops  []*loop
	next   atomic.Uint32
	active atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	err    error // the loops could not be created
}

// New returns a relay; its loops start with the first stream.
func New(cfg Config) *Relay { return &Relay{cfg: cfg} }

// Active returns the streams being relayed.
func (r *Relay) Active() int { return int(r.active.Load()) }

// Start relays a stream. It owns s.Up and s.Client from then on: on error
// it has closed them (and s.Obs hears nothing).
func (r *Relay) Start(s Spec) error {
	r.start.Do(r.startLoops)
	r.mu.Lock()
	if r.closed || r.err != nil {
		err := r.err
		r.mu.Unlock()
		unix.Close(s.Up)
		unix.Close(s.Client)
		if err == nil {
			err = ErrClosed
		}
		return err
	}
	l := r.loops[int(r.next.Add(1))%len(r.loops)]
	st := &stream{spec: s}
	st.spec.In = append([]byte(nil), s.In...)
	r.active.Add(1)
	l.mu.Lock()
	l.queue = append(l.queue, st)
	l.mu.Unlock()
	r.mu.Unlock()
	l.wake()
	return nil
}

func (r *Relay) startLoops() {
	n := r.cfg.loops(runtime.GOMAXPROCS(0))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	for range n {
		l, err := newLoop(r)
		if err != nil {
			r.err = err
			break
		}
		r.loops = append(r.loops, l)
	}
	if r.err != nil {
		for _, l := range r.loops {
			l.closeFDs()
		}
		r.loops = nil
		return
	}
	for _, l := range r.loops {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			l.run()
		}()
	}
}

// Wait returns when no stream is left, or with ctx's error when ctx ends
// first. Streams started meanwhile count.
func (r *Relay) Wait(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for r.active.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Close ends every stream (Stopped), stops the loops and waits for them.
// Later Starts fail with ErrClosed.
func (r *Relay) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	loops := r.loops
	r.mu.Unlock()
	for _, l := range loops {
		l.mu.Lock()
		l.stopping = true
		l.mu.Unlock()
		l.wake()
	}
	r.wg.Wait()
}

// Detach returns a descriptor of c's socket that the caller owns (a
// duplicate, close-on-exec); the caller then closes c, which leaves the
// socket open through the duplicate. c must be non-blocking, as every
// socket of the net package and every connection Resume and ResumeClient
// make is: a duplicate shares the open file's O_NONBLOCK, so it is not
// set again (two system calls per socket on every stream's way in).
func Detach(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, ErrUnsupported
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	return fd, nil
}

// CloseFD closes a descriptor the relay gave back.
func CloseFD(fd int) { unix.Close(fd) }

// Resume makes a net.Conn of an upstream descriptor the relay gave back
// (Result.Up), for the next request on it, and owns the descriptor from
// then on. It is cheaper than net.FileConn, which duplicates the
// descriptor and asks the kernel for the socket's type and both addresses
// (a dozen system calls, on the way to a stream's first event): the
// descriptor is taken as it is, as an *os.File on the runtime poller (two
// system calls), and the connection reports no addresses.
func Resume(fd int) net.Conn { return resumed{File: os.NewFile(uintptr(fd), "upstream")} }

// ResumeClient is Resume for a client descriptor the relay gave back
// (Result.Client), for the connection's next request: it reports laddr
// and raddr, the addresses the connection had before its stream (the
// server logs and forwards the client's), and its write side can be shut
// (CloseWrite), as a lingering close does.
func ResumeClient(fd int, laddr, raddr net.Addr) net.Conn {
	return resumed{File: os.NewFile(uintptr(fd), "client"), laddr: laddr, raddr: raddr}
}

// resumed is a socket as an *os.File, which reads, writes, takes deadlines
// and gives its descriptor (SyscallConn, so Detach works on it) as a
// net.Conn does.
type resumed struct {
	*os.File
	laddr, raddr net.Addr
}

// LocalAddr returns the address it was given, or nil.
func (c resumed) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the address it was given, or nil.
func (c resumed) RemoteAddr() net.Addr { return c.raddr }

// CloseWrite shuts the socket's write side.
func (c resumed) CloseWrite() error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return serr
}

// Quiet reports whether the idle connection fd (an upstream the relay
// gave back) may carry a request: a non-blocking MSG_PEEK recv finds
// nothing to read (EAGAIN). EOF, a reset or bytes nobody asked for (the
// peer closed it, or sent past its answer) make it unusable.
func Quiet(fd int) bool {
	var b [1]byte
	for {
		_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return true
		}
		return false
	}
}

// stream is one relayed stream; only its loop touches it.
type stream struct {
	spec    Spec
	slot    int32
	gen     uint32
	dec     Decoder
	pending []byte // bytes the client has not taken yet
	upOn    bool   // the upstream is in the epoll set
	sawData bool
	// upClean: the upstream's body ended exactly where its last read did
	// (nothing after the trailers): its connection is at a message
	// boundary and may be given back (Result.Up).
	upClean bool
	tail    [2]byte // the last two body bytes
	lastUp  int64   // when the upstream last sent (loop clock)
	stalled int64   // when pending last made progress
	// final is set when the body's end (or the error event) is in
	// pending: the stream ends with it when pending drains.
	final    bool
	finalRes Result
}

// loop is one event loop: an epoll set, an eventfd to wake it, and the
// streams it owns.
type loop struct {
	r          *Relay
	epfd, evfd int
	base       time.Time

	mu       sync.Mutex
	queue    []*stream
	stopping bool

	slots  []*stream
	gens   []uint32
	free   []int32
	buf    []byte
	body   []byte
	out    []byte
	events []unix.EpollEvent
	now    int64
	swept  int64
}

func newLoop(r *Relay) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so that os.NewFile hands it to the runtime poller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeSlot}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, err
	}
	return &loop{
		r: r, epfd: epfd, evfd: evfd, base: time.Now(),
		buf:    make([]byte, bufSize),
		body:   make([]byte, 0, bufSize),
		out:    make([]byte, 0, bufSize+64),
		events: make([]unix.EpollEvent, maxEvents),
	}, nil
}

func (l *loop) closeFDs() {
	unix.Close(l.epfd)
	unix.Close(l.evfd)
}

func (l *loop) wake() {
	one := [8]byte{1}
	_, _ = unix.Write(l.evfd, one[:])
}

func (l *loop) clock() int64 { return int64(time.Since(l.base)) }

// run waits for the loop's epoll set to have events through the runtime
// poller (the set's own descriptor is pollable): the goroutine parks like
// any other waiting on a socket, so no thread sits blocked in epoll_wait
// and a wake-up costs what a goroutine's does. Once woken it takes events
// without waiting (epoll_wait with no timeout) until none is left, and
// parks again. A read deadline of sweepEvery wakes it for the timeouts.
func (l *loop) run() {
	defer unix.Close(l.evfd)
	f := os.NewFile(uintptr(l.epfd), "relay-epoll") // owns epfd from here
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		l.stopAll(err)
		return
	}
	var fatal error
	stop := false
	poll := func(uintptr) bool {
		for {
			n, err := sysEpollWait(l.epfd, l.events)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				fatal = err
				return true
			case n == 0:
				return false // park until the set has events
			}
			more := n == len(l.events)
			l.now = l.clock()
			if l.handle(n) {
				stop = true
				return true
			}
			if l.now-l.swept >= int64(sweepEvery) {
				l.sweep()
			}
			if !more {
				// Every event taken was handled to the end (each upstream
				// read until it had no more, each write until the client
				// took no more), so what is left to happen raises a new
				// event, which wakes the poller again: parking now misses
				// nothing, and saves an epoll_wait per wake-up.
				return false
			}
		}
	}
	for {
		_ = f.SetReadDeadline(time.Now().Add(sweepEvery))
		err := rc.Read(poll)
		switch {
		case stop:
			l.stopAll(ErrClosed)
			return
		case fatal != nil:
			l.stopAll(fatal)
			return
		case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
			l.stopAll(err)
			return
		}
		l.now = l.clock()
		if l.now-l.swept >= int64(sweepEvery) {
			l.sweep()
		}
	}
}

// handle dispatches n events; it reports whether the loop must stop.
func (l *loop) handle(n int) bool {
	for i := 0; i < n; i++ {
		ev := &l.events[i]
		if ev.Fd == wakeSlot {
			if l.admit() {
				return true
			}
			continue
		}
		slot, gen, side := ev.Fd, uint32(ev.Pad)>>1, ev.Pad&1
		if int(slot) >= len(l.slots) || l.slots[slot] == nil || l.gens[slot] != gen {
			continue // the stream ended earlier in this batch
		}
		s := l.slots[slot]
		if side == 0 {
			l.readUp(s)
		} else {
			l.clientEvent(s, ev.Events)
		}
	}
	return false
}

// admit takes the queued streams in; it reports whether the loop must
// stop.
func (l *loop) admit() bool {
	var b [8]byte
	_, _ = unix.Read(l.evfd, b[:])
	l.mu.Lock()
	q, stop := l.queue, l.stopping
	l.queue = nil
	l.mu.Unlock()
	for i, s := range q {
		if stop {
			l.r.endStream(s, Result{Outcome: Stopped, Client: -1, Err: ErrClosed})
			q[i] = nil
			continue
		}
		l.add(s)
	}
	return stop
}

func (l *loop) add(s *stream) {
	if n := len(l.free); n > 0 {
		s.slot = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		s.slot = int32(len(l.slots))
		l.slots = append(l.slots, nil)
		l.gens = append(l.gens, 0)
	}
	l.gens[s.slot]++
	s.gen = l.gens[s.slot] & (1<<30 - 1)
	l.gens[s.slot] = s.gen
	l.slots[s.slot] = s
	s.lastUp = l.now
	if err := l.ctl(unix.EPOLL_CTL_ADD, s.spec.Client, s, 1, unix.EPOLLRDHUP); err != nil {
		l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: err})
		return
	}
	if err := l.upOn(s); err != nil {
		l.finish(s, Result{Outcome: UpstreamFailed, Client: -1, Err: err})
		return
	}
	head, in := s.spec.Head, s.spec.In
	s.spec.Head, s.spec.In = nil, nil
	l.consume(s, head, in)
}

func (l *loop) ctl(op, fd int, s *stream, side int32, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: s.slot, Pad: int32(s.gen<<1) | side}
	return unix.EpollCtl(l.epfd, op, fd, &ev)
}

func (l *loop) upOn(s *stream) error {
	if s.upOn {
		return nil
	}
	if err := l.ctl(unix.EPOLL_CTL_ADD, s.spec.Up, s, 0, unix.EPOLLIN|unix.EPOLLRDHUP); err != nil {
		return err
	}
	s.upOn = true
	s.lastUp = l.now
	return nil
}

func (l *loop) upOff(s *stream) {
	if s.upOn {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, s.spec.Up, nil)
		s.upOn = false
	}
}

// readUp reads what the upstream sent and passes it on.
func (l *loop) readUp(s *stream) {
	for {
		n, err := sysRecv(s.spec.Up, l.buf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			l.upstreamFailed(s, err, false)
			return
		case n == 0:
			l.upstreamFailed(s, errUpstreamEOF, false)
			return
		}
		s.lastUp = l.now
		if !l.consume(s, nil, l.buf[:n]) || n < len(l.buf) {
			return
		}
	}
}

// frame appends body bytes as the client reads them: one chunk, or, for
// an HTTP/1.0 client, the bytes themselves.
func (s *stream) frame(dst, body []byte) []byte {
	if s.spec.Identity {
		return append(dst, body...)
	}
	return appendChunk(dst, body)
}

// end appends what ends the body for the client: the last chunk, or, for
// an HTTP/1.0 client, nothing (closing its connection ends the body).
func (s *stream) end(dst []byte) []byte {
	if s.spec.Identity {
		return dst
	}
	return append(dst, lastChunk...)
}

// consume decodes in and writes head, then the body bytes of in as one
// chunk (and the last chunk when the body ended). It reports whether the
// upstream may be read further.
func (l *loop) consume(s *stream, head, in []byte) bool {
	body, used, err := s.dec.Feed(l.body[:0], in)
	if len(body) > 0 {
		s.spec.Obs.Data(body)
		s.sawData = true
		if len(body) >= 2 {
			s.tail = [2]byte{body[len(body)-2], body[len(body)-1]}
		} else {
			s.tail = [2]byte{s.tail[1], body[0]}
		}
	}
	out := append(l.out[:0], head...)
	if len(body) > 0 {
		out = s.frame(out, body)
	}
	done := s.dec.Done()
	if done {
		out = s.end(out)
	}
	if err == nil && done && used < len(in) {
		err = ErrAfterFinal // the body is whole; the extra bytes are dropped with the connection
	}
	s.upClean = done && err == nil
	l.out = out[:0]
	switch {
	case done:
		l.send(s, out, &Result{Outcome: Complete})
		return false
	case err != nil:
		if len(out) > 0 && !l.send(s, out, nil) {
			return false
		}
		l.upstreamFailed(s, err, false)
		return false
	case len(out) > 0:
		return l.send(s, out, nil)
	}
	return true
}

// send writes b to the client; what does not go out now waits in pending,
// with the upstream out of the epoll set until it drained. final, when
// set, ends the stream once b is out. It reports whether the stream goes
// on with its upstream readable.
func (l *loop) send(s *stream, b []byte, final *Result) bool {
	if len(s.pending) == 0 {
		n, err := writeSome(s.spec.Client, b)
		if err != nil {
			l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: err})
			return false
		}
		b = b[n:]
		if len(b) == 0 {
			if final != nil {
				final.Client = s.spec.Client
				l.finish(s, *final)
				return false
			}
			return true
		}
		s.stalled = l.now
		if err := l.ctl(unix.EPOLL_CTL_MOD, s.spec.Client, s, 1, unix.EPOLLOUT|unix.EPOLLRDHUP); err != nil {
			l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: err})
			return false
		}
	}
	s.pending = append(s.pending, b...)
	l.upOff(s)
	if final != nil {
		s.final, s.finalRes = true, *final
	}
	return false
}

// writeSome writes what the socket takes now.
func writeSome(fd int, b []byte) (int, error) {
	for {
		n, err := sysSend(fd, b)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return 0, nil
		case err != nil:
			return 0, err
		}
		return n, nil
	}
}

func (l *loop) clientEvent(s *stream, events uint32) {
	if events&(unix.EPOLLERR|unix.EPOLLHUP|unix.EPOLLRDHUP) != 0 {
		l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: errClientHup})
		return
	}
	if events&unix.EPOLLOUT == 0 || len(s.pending) == 0 {
		return
	}
	n, err := writeSome(s.spec.Client, s.pending)
	if err != nil {
		l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: err})
		return
	}
	if n == 0 {
		return
	}
	s.stalled = l.now
	if n < len(s.pending) {
		s.pending = s.pending[:copy(s.pending, s.pending[n:])]
		return
	}
	s.pending = nil
	if s.final {
		r := s.finalRes
		r.Client = s.spec.Client
		l.finish(s, r)
		return
	}
	if err := l.ctl(unix.EPOLL_CTL_MOD, s.spec.Client, s, 1, unix.EPOLLRDHUP); err != nil {
		l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: err})
		return
	}
	if err := l.upOn(s); err != nil {
		l.upstreamFailed(s, err, false)
		return
	}
	// Bytes may have arrived while the upstream was out of the set.
	l.readUp(s)
}

// upstreamFailed ends a stream whose upstream failed before the body's
// end: between two events of an SSE body (or before the first) with the
// error event and a clean end, otherwise by closing the client. Every body
// byte decoded went to the client at once, so what the client has ends
// where tail says, whatever the decoder was reading when the framing broke
// (a chunk's size line or extension, its CRLF, the trailers).
func (l *loop) upstreamFailed(s *stream, err error, timedOut bool) {
	res := Result{Outcome: UpstreamFailed, Client: -1, Err: err, TimedOut: timedOut}
	if s.final {
		return // ending already
	}
	if !s.spec.SSE || (s.sawData && s.tail != [2]byte{'\n', '\n'}) || len(l.r.cfg.ErrorEvent) == 0 {
		l.finish(s, res)
		return
	}
	out := s.end(s.frame(l.out[:0], l.r.cfg.ErrorEvent))
	l.out = out[:0]
	l.upOff(s)
	l.send(s, out, &res)
}

// sweep ends streams past their timeouts.
func (l *loop) sweep() {
	l.swept = l.now
	idle, stall := int64(l.r.cfg.UpstreamIdle), int64(l.r.cfg.WriteStall)
	for _, s := range l.slots {
		switch {
		case s == nil:
		case len(s.pending) > 0:
			if stall > 0 && l.now-s.stalled > stall {
				l.finish(s, Result{Outcome: ClientGone, Client: -1, Err: errStall})
			}
		case idle > 0 && s.upOn && l.now-s.lastUp > idle:
			l.upstreamFailed(s, errIdle, true)
		}
	}
}

// finish ends s: its upstream is closed, its client closed or given back
// (r.Client), and its observer told.
func (l *loop) finish(s *stream, r Result) {
	l.upOff(s)
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, s.spec.Client, nil)
	l.slots[s.slot] = nil
	l.free = append(l.free, s.slot)
	l.r.endStream(s, r)
}

// stopAll ends every stream of the loop (Stopped).
func (l *loop) stopAll(err error) {
	l.mu.Lock()
	q := l.queue
	l.queue = nil
	l.stopping = true
	l.mu.Unlock()
	for _, s := range q {
		l.r.endStream(s, Result{Outcome: Stopped, Client: -1, Err: err})
	}
	for _, s := range l.slots {
		if s != nil {
			l.finish(s, Result{Outcome: Stopped, Client: -1, Err: err})
		}
	}
}

// endStream closes what the stream no longer needs (the upstream unless
// it is given back, see Result.Up) and tells its observer. The upstream is
// out of the loop's epoll set by then (finish), or never was in it.
func (r *Relay) endStream(s *stream, res Result) {
	res.Up = -1
	if s.spec.KeepUp && s.upClean && res.Outcome == Complete {
		res.Up = s.spec.Up
	} else {
		unix.Close(s.spec.Up)
	}
	if res.Client < 0 {
		unix.Close(s.spec.Client)
	}
	s.pending = nil
	r.active.Add(-1)
	s.spec.Obs.End(res)
}

// The loop's system calls never wait (non-blocking sockets, epoll_wait
// with no timeout), so they are made raw, without the scheduler's syscall
// bookkeeping (which also wakes the runtime's monitor thread when it
// sleeps): the relay's goroutine keeps its thread throughout.

func sysRecv(fd int, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sysSend writes with MSG_NOSIGNAL: a client gone is EPIPE, not SIGPIPE.
func sysSend(fd int, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), syscall.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sysEpollWait takes the ready events without waiting.
func sysEpollWait(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := syscall.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
