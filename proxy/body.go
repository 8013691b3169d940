package proxy

import (
	"errors"
	"io"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Request bodies in memory.
//
// The server hands a request to the handler once its head is read
// (fasthttp's StreamRequestBody); the handler reads the body itself
// (readBody) into a buffer held against one budget for every connection,
// MaxBodyMemory bytes. Without it, each body could take up to MaxBodySize
// and nothing bounded their sum: fifty clients each sending a 31 MiB body
// one byte short took a router's memory.
//
// A body up to largeBody is charged its Content-Length at once. A larger
// one is charged largeBody first and the rest of its length once those
// bytes arrived, so a length a client only declares holds at most
// largeBody; a chunked one as its bytes arrive (its buffer doubles as it
// fills). Bodies over largeBody may together take at most half of the
// budget, so the other half stays for ordinary prompts however many large
// uploads are pending. A body that does not fit waits up to BodyMemoryWait
// for room, and is then answered 503 body_memory_full (Retry-After: 1).
// The buffer and its charge are given back when the handler is done with
// the request: for a streamed answer once its headers came (the stream
// goes on without the body), for a complete answer once it was read, and at
// once for a request answered without a backend.
//
// Buffers up to largeBody are pooled by size class; larger ones are left
// to the garbage collector, and the trimmer (trim.go) returns their memory
// to the system once the large bodies have gone.

// largeBody is the size above which a body counts as large.
const largeBody = 1 << 20

// minBodyBuf is the smallest pooled buffer class; bodyClasses the number
// of classes (powers of two from minBodyBuf to largeBody).
const (
	minBodyBuf  = 4 << 10
	bodyClasses = 9 // 4 KiB .. 1 MiB
)

// errBodyMemoryFull: the body did not fit the budget within BodyMemoryWait.
var errBodyMemoryFull = errors.New("request body memory full")

// bodyBudget bounds the bytes of request bodies held at once.
type bodyBudget struct {
	limit, largeLimit int64

	mu      sync.Mutex
	used    int64         // bytes charged
	large   int64         // of used, by bodies over largeBody
	waiting int           // takers waiting for room
	freed   chan struct{} // closed when bytes are given back to a waiter

	peakLarge atomic.Int64 // the most large bytes held since the trimmer last looked
	pools     [bodyClasses]sync.Pool
}

func newBodyBudget(limit int64) *bodyBudget {
	return &bodyBudget{limit: limit, largeLimit: limit / 2, freed: make(chan struct{})}
}

// take charges n bytes (large: to a body over largeBody), waiting until
// deadline for room. It reports false when there was none.
func (bb *bodyBudget) take(n int64, large bool, deadline time.Time) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		bb.mu.Lock()
		if bb.used+n <= bb.limit && (!large || bb.large+n <= bb.largeLimit) {
			bb.used += n
			if large {
				bb.large += n
				if bb.large > bb.peakLarge.Load() {
					bb.peakLarge.Store(bb.large)
				}
			}
			bb.mu.Unlock()
			return true
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			bb.mu.Unlock()
			return false
		}
		freed := bb.freed
		bb.waiting++
		bb.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-freed:
		case <-timer.C:
			timer = nil
			// One more look: the room may have come with the deadline.
			deadline = time.Time{}
		}
		bb.mu.Lock()
		bb.waiting--
		bb.mu.Unlock()
	}
}

// give returns n bytes charged by take.
func (bb *bodyBudget) give(n int64, large bool) {
	if n == 0 {
		return
	}
	bb.mu.Lock()
	bb.used -= n
	if large {
		bb.large -= n
	}
	if bb.waiting > 0 {
		close(bb.freed)
		bb.freed = make(chan struct{})
	}
	bb.mu.Unlock()
}

// held returns the bytes charged now, and of them the large bodies'.
func (bb *bodyBudget) held() (used, large int64) {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	return bb.used, bb.large
}

// bodyClass returns the pool class of a buffer of n bytes (n <= largeBody).
func bodyClass(n int) int {
	if n <= minBodyBuf {
		return 0
	}
	return bits.Len(uint(n-1)) - bits.Len(minBodyBuf-1)
}

// buf returns a buffer of length n: pooled up to largeBody (then it comes
// with its pool handle, else nil).
func (bb *bodyBudget) buf(n int) ([]byte, *[]byte) {
	if n > largeBody {
		return make([]byte, n), nil
	}
	c := bodyClass(n)
	h, _ := bb.pools[c].Get().(*[]byte)
	if h == nil {
		b := make([]byte, 0, minBodyBuf<<c)
		h = &b
	}
	return (*h)[:n], h
}

// put takes back a buffer from buf by its handle (nil: not pooled).
func (bb *bodyBudget) put(h *[]byte) {
	if h != nil {
		bb.pools[bodyClass(cap(*h))].Put(h)
	}
}

// reqBody is the body a request holds: its buffer (with its pool handle
// when pooled) and its charge.
type reqBody struct {
	buf     []byte
	pooled  *[]byte
	charged int64
	large   bool
}

// readBody reads the request's body into memory charged to the body
// budget and makes it the request's body. It reports false when it
// answered the request itself: 413 over MaxBodySize, 503 when the budget
// stays full, 408 or 400 when the client does not send the body it
// announced. The caller gives the body back with dropBody.
func (p *Proxy) readBody(ctx *fasthttp.RequestCtx, rt route, rb *reqBody) bool {
	req := &ctx.Request
	cl := req.Header.ContentLength()
	src := req.BodyStream()
	if src == nil || cl == 0 || cl == -2 {
		// No body, or one fasthttp read whole (a request that was not
		// streamed, as in tests that call the handler directly).
		return true
	}
	maxSize := int(p.cfg.MaxBodySize)
	if cl > maxSize {
		p.bodyRefused(ctx, rt, fasthttp.StatusRequestEntityTooLarge, "body_too_large",
			"request body of "+strconv.Itoa(cl)+" bytes exceeds the limit of "+strconv.Itoa(maxSize)+" bytes (max-body-size)")
		return false
	}
	deadline := time.Now().Add(p.cfg.BodyMemoryWait)
	// limit is the most bytes to hold: the declared length, or for a
	// chunked body the maximum.
	limit := cl
	size := min(limit, largeBody)
	if cl < 0 {
		limit = maxSize
		size = min(minBodyBuf, limit)
	}
	if !p.grow(rb, size, deadline) {
		p.bodyFull(ctx, rt)
		return false
	}
	n, idle := 0, 0
	for {
		if n == len(rb.buf) {
			if n == limit {
				if cl >= 0 {
					break
				}
				more, err := hasMore(src)
				if err != nil {
					p.bodyUnread(ctx, rt, err)
					return false
				}
				if more {
					p.bodyRefused(ctx, rt, fasthttp.StatusRequestEntityTooLarge, "body_too_large",
						"request body exceeds the limit of "+strconv.Itoa(maxSize)+" bytes (max-body-size)")
					return false
				}
				break
			}
			next := 2 * n
			if cl >= 0 {
				// A declared length: once the client has sent the first
				// largeBody bytes, room for the rest at once (one copy,
				// no garbage of doubling buffers).
				next = limit
			}
			if !p.grow(rb, min(next, limit), deadline) {
				p.bodyFull(ctx, rt)
				return false
			}
		}
		m, err := src.Read(rb.buf[n:])
		n += m
		if err == io.EOF {
			break
		}
		if err == nil && m == 0 {
			if idle++; idle == 100 {
				err = io.ErrNoProgress
			}
		} else {
			idle = 0
		}
		if err != nil {
			p.bodyUnread(ctx, rt, err)
			return false
		}
	}
	if cl >= 0 && n < cl {
		p.bodyUnread(ctx, rt, io.ErrUnexpectedEOF)
		return false
	}
	req.SetBodyRaw(rb.buf[:n])
	return true
}

// hasMore reports whether src gives another byte before its end.
func hasMore(src io.Reader) (bool, error) {
	var one [1]byte
	for i := 0; i < 100; i++ {
		n, err := src.Read(one[:])
		switch {
		case n > 0:
			return true, nil
		case err == io.EOF:
			return false, nil
		case err != nil:
			return false, err
		}
	}
	return false, io.ErrNoProgress
}

// grow makes rb's buffer size bytes long (keeping what it holds), charging
// the difference to the budget.
func (p *Proxy) grow(rb *reqBody, size int, deadline time.Time) bool {
	bb := p.bodies
	large := size > largeBody
	if large && !rb.large && rb.charged > 0 {
		// Moving to the large share: charge the whole size there.
		if !bb.take(int64(size), true, deadline) {
			return false
		}
		bb.give(rb.charged, false)
	} else if !bb.take(int64(size)-rb.charged, large, deadline) {
		return false
	}
	rb.charged, rb.large = int64(size), large
	nb, h := bb.buf(size)
	copy(nb, rb.buf)
	bb.put(rb.pooled)
	rb.buf, rb.pooled = nb, h
	return true
}

// dropBody gives rb's buffer and charge back; the request's body is
// emptied first, so nothing refers to the buffer.
func (p *Proxy) dropBody(ctx *fasthttp.RequestCtx, rb *reqBody) {
	if rb.charged == 0 {
		return
	}
	ctx.Request.SetBodyRaw(nil)
	p.bodies.put(rb.pooled)
	p.bodies.give(rb.charged, rb.large)
	*rb = reqBody{}
}

// bodyFull answers a request whose body found no room in the budget.
func (p *Proxy) bodyFull(ctx *fasthttp.RequestCtx, rt route) {
	p.m.bodiesRefused.Inc()
	p.bodyRefused(ctx, rt, fasthttp.StatusServiceUnavailable, "body_memory_full",
		"the router holds as many request bodies in memory as it may (max-body-memory); retry later")
	ctx.Response.Header.Set("Retry-After", "1")
}

// bodyUnread answers a request whose body did not arrive whole: the read
// timeout (408) or a client that stopped or broke its framing (400).
func (p *Proxy) bodyUnread(ctx *fasthttp.RequestCtx, rt route, err error) {
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		p.bodyRefused(ctx, rt, fasthttp.StatusRequestTimeout, "request_timeout", "timed out reading the request body")
		return
	}
	p.bodyRefused(ctx, rt, fasthttp.StatusBadRequest, "bad_request", "cannot read the request body: "+err.Error())
}

// bodyRefused answers a request before its body was read to the end, and
// closes the connection after a lingering close (see handleServerError).
func (p *Proxy) bodyRefused(ctx *fasthttp.RequestCtx, rt route, status int, code, msg string) {
	writeError(ctx, status, code, msg)
	ctx.SetConnectionClose()
	if l, ok := ctx.Conn().(interface{ lingerOnClose() }); ok {
		l.lingerOnClose()
	}
	p.answered(ctx, rt, status)
}
