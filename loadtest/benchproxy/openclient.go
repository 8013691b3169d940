package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// openClientSpec is what the open-streams client does: N streams, stream
// i to Addrs[i%len(Addrs)] with request Requests[i%len(Requests)] (bodies
// asking for "stream":true), started one after another over Ramp, each on
// a connection of its own. The stubs send Chunks events Gap apart after
// Prefill.
type openClientSpec struct {
	Addrs    []string
	Bodies   [][]byte
	N        int
	Chunks   int
	Gap      time.Duration
	Prefill  time.Duration
	Ramp     time.Duration
	DialWait time.Duration // bound on one dial (default 10s)
	// Untimed says the events carry no send time (an engine, not the
	// stub): they are counted, not timed, and a stream must bring at
	// least Chunks of them before [DONE] (an engine adds its own: the
	// role, the finish reason, the usage).
	Untimed bool
}

// openStreamSlack is how long past its expected end a stream may take
// before the client gives up on it (an error).
const openStreamSlack = 30 * time.Second

// Latency histograms: 1 us to 10 min, 3 significant digits, in
// microseconds; streams record into one of latShards shards (each with its
// own lock) by their index, merged at the end.
const (
	latLowest  = 1
	latHighest = int64(10 * time.Minute / time.Microsecond)
	latDigits  = 3
	latShards  = 8
)

type latShard struct {
	mu           sync.Mutex
	first, later *hdrhistogram.Histogram
}

// maxErrorSamples bounds the error messages an openClient keeps.
const maxErrorSamples = 5

// openClient runs the streams of one open-streams run. Its counters may be
// read while it runs.
type openClient struct {
	spec openClientSpec
	reqs [][]byte // per address and body: the whole request

	events atomic.Int64 // data events received (not [DONE])
	firsts atomic.Int64 // streams that received their first event
	ok     atomic.Int64 // streams that ended as they should
	failed atomic.Int64 // streams that did not

	allFirst     chan struct{} // closed when every stream had its first event
	allFirstOnce sync.Once
	done         chan struct{} // closed when every stream ended
	started      time.Time     // when the first stream was due

	shards [latShards]latShard

	errMu      sync.Mutex
	errSamples []string
}

func newOpenClient(spec openClientSpec) (*openClient, error) {
	switch {
	case spec.N < 1 || len(spec.Addrs) == 0 || len(spec.Bodies) == 0:
		return nil, errors.New("open streams: no stream, address or body")
	case spec.Chunks < 1 || spec.Chunks > maxBenchChunks || spec.Gap < 0 || spec.Gap > maxBenchGap || spec.Ramp < 0:
		return nil, errors.New("open streams: chunks, gap or ramp out of range")
	}
	if spec.DialWait <= 0 {
		spec.DialWait = 10 * time.Second
	}
	c := &openClient{spec: spec, allFirst: make(chan struct{}), done: make(chan struct{})}
	for _, a := range spec.Addrs {
		for _, b := range spec.Bodies {
			c.reqs = append(c.reqs, openRequest(a, b, spec.Gap, spec.Chunks))
		}
	}
	for i := range c.shards {
		c.shards[i].first = hdrhistogram.New(latLowest, latHighest, latDigits)
		c.shards[i].later = hdrhistogram.New(latLowest, latHighest, latDigits)
	}
	return c, nil
}

// openRequest is the whole request of one open stream to addr.
func openRequest(addr string, body []byte, gap time.Duration, chunks int) []byte {
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + addr +
		"\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n" +
		gapHeader + ": " + gap.String() + "\r\n" + chunksHeader + ": " + strconv.Itoa(chunks) + "\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	return append([]byte(head), body...)
}

// start launches the streams (a goroutine each), the first at once and the
// others spread evenly over the ramp. They end by themselves, or when ctx
// ends; done is closed once all have.
func (c *openClient) start(ctx context.Context) {
	c.started = time.Now()
	n := c.spec.N
	var wg sync.WaitGroup
	wg.Add(n)
	for i := 0; i < n; i++ {
		at := c.started
		if n > 1 {
			at = at.Add(time.Duration(int64(c.spec.Ramp) * int64(i) / int64(n-1)))
		}
		go func() {
			defer wg.Done()
			if err := c.stream(ctx, i, at); err != nil {
				c.failed.Add(1)
				c.noteError(fmt.Errorf("stream %d: %w", i, err))
				return
			}
			c.ok.Add(1)
		}()
	}
	go func() {
		wg.Wait()
		close(c.done)
	}()
}

func (c *openClient) noteError(err error) {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	if len(c.errSamples) < maxErrorSamples {
		c.errSamples = append(c.errSamples, err.Error())
	}
}

// errorSamples returns the first few errors.
func (c *openClient) errorSamples() []string {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return slices.Clone(c.errSamples)
}

// openStreamBuffer is a stream's read buffer: an event is about 200
// bytes.
const openStreamBuffer = 4 << 10

// maxPendingEvent bounds the bytes of one SSE event the client holds.
const maxPendingEvent = 64 << 10

var errStreamShort = errors.New("stream ended early")

// stream runs stream i: it waits until at, connects, sends its request and
// reads the answer to its end.
func (c *openClient) stream(ctx context.Context, i int, at time.Time) error {
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	addr := c.spec.Addrs[i%len(c.spec.Addrs)]
	d := net.Dialer{Timeout: c.spec.DialWait}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	expected := c.spec.Prefill + time.Duration(c.spec.Chunks)*c.spec.Gap
	_ = conn.SetDeadline(time.Now().Add(expected + openStreamSlack))
	ai := i % len(c.spec.Addrs)
	req := c.reqs[ai*len(c.spec.Bodies)+(i/len(c.spec.Addrs))%len(c.spec.Bodies)]
	if _, err := conn.Write(req); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, openStreamBuffer)
	if err := readStreamHead(br); err != nil {
		return err
	}
	sh := &c.shards[i%latShards]
	var r sseReader
	got := 0
	for {
		data, err := r.next(br)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("%w after %d of %d events: %v", errStreamShort, got, c.spec.Chunks, err)
			}
			return fmt.Errorf("after %d of %d events: %w", got, c.spec.Chunks, err)
		}
		if data == nil { // the last chunk
			if !r.done || got < c.spec.Chunks || (!c.spec.Untimed && got != c.spec.Chunks) {
				return fmt.Errorf("%w: %d of %d events, [DONE] %v", errStreamShort, got, c.spec.Chunks, r.done)
			}
			return nil
		}
		now := time.Now().UnixNano()
		for {
			ev, ok := r.event()
			if !ok {
				break
			}
			if bytes.HasPrefix(ev, []byte("data: [DONE]")) {
				r.done = true
				continue
			}
			if !c.spec.Untimed {
				sent, ok := parseEventTime(ev)
				if !ok {
					return fmt.Errorf("event %d carries no send time", got)
				}
				lat := max(latLowest, min(latHighest, (now-sent)/int64(time.Microsecond)))
				sh.mu.Lock()
				if got == 0 {
					sh.first.RecordValue(lat)
				} else {
					sh.later.RecordValue(lat)
				}
				sh.mu.Unlock()
			}
			got++
			c.events.Add(1)
			if got == 1 && c.firsts.Add(1) == int64(c.spec.N) {
				c.allFirstOnce.Do(func() { close(c.allFirst) })
			}
		}
	}
}

// latencies merges the shards: one-way latency of the first event of
// every stream, and of the later events.
func (c *openClient) latencies() (first, later *hdrhistogram.Histogram) {
	first = hdrhistogram.New(latLowest, latHighest, latDigits)
	later = hdrhistogram.New(latLowest, latHighest, latDigits)
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		first.Merge(sh.first)
		later.Merge(sh.later)
		sh.mu.Unlock()
	}
	return first, later
}

// readStreamHead reads a response head and fails unless it is a 200 with
// a chunked body.
func readStreamHead(br *bufio.Reader) error {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return fmt.Errorf("status line: %w", err)
	}
	f := bytes.Fields(line)
	if len(f) < 2 || !bytes.HasPrefix(f[0], []byte("HTTP/1.")) {
		return fmt.Errorf("bad status line %q", line)
	}
	status := string(f[1])
	chunked := false
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("headers: %w", err)
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		k, v, _ := bytes.Cut(h, []byte(":"))
		if bytes.EqualFold(bytes.TrimSpace(k), []byte("Transfer-Encoding")) && bytes.Contains(bytes.ToLower(v), []byte("chunked")) {
			chunked = true
		}
	}
	if status != "200" {
		// What of the body has arrived says why (an error code).
		body, _ := br.Peek(min(br.Buffered(), maxErrorBody))
		return fmt.Errorf("status %s: %q", status, body)
	}
	if !chunked {
		return errors.New("answer not chunked")
	}
	return nil
}

// maxErrorBody bounds the bytes of an error answer quoted in an error.
const maxErrorBody = 200

// sseReader takes an SSE stream out of HTTP/1.1 chunks. A proxy may join
// or split events across chunks, so the data is kept until an event's
// blank line arrives. Its buffer is reused: no allocation per event.
type sseReader struct {
	buf  []byte // data not yet returned as events
	off  int    // start of the next event in buf
	done bool   // [DONE] was seen
}

// next reads one chunk into the buffer. It returns nil data (and no
// error) at the last chunk, after reading the trailers.
func (r *sseReader) next(br *bufio.Reader) ([]byte, error) {
	size, err := readChunkSize(br)
	if err != nil {
		return nil, err
	}
	if size == 0 {
		for {
			l, err := br.ReadSlice('\n')
			if err != nil {
				return nil, err
			}
			if len(bytes.TrimRight(l, "\r\n")) == 0 {
				return nil, nil
			}
		}
	}
	// Drop what was returned, keep a partial event.
	if r.off > 0 {
		r.buf = r.buf[:copy(r.buf, r.buf[r.off:])]
		r.off = 0
	}
	if len(r.buf)+size > maxPendingEvent {
		return nil, fmt.Errorf("an SSE event over %d bytes", maxPendingEvent)
	}
	n := len(r.buf)
	r.buf = slices.Grow(r.buf, size)[:n+size]
	if _, err := io.ReadFull(br, r.buf[n:]); err != nil {
		return nil, err
	}
	var crlf [2]byte
	if _, err := io.ReadFull(br, crlf[:]); err != nil {
		return nil, err
	}
	if crlf != [2]byte{'\r', '\n'} {
		return nil, errors.New("chunk not followed by CRLF")
	}
	return r.buf[n:], nil
}

// event returns the next whole event in the buffer (without its blank
// line), valid until the next call of next.
func (r *sseReader) event() ([]byte, bool) {
	rest := r.buf[r.off:]
	i := bytes.Index(rest, []byte("\n\n"))
	if i < 0 {
		return nil, false
	}
	r.off += i + 2
	return rest[:i], true
}

// readChunkSize reads a chunk-size line (extensions ignored): at most 8
// hex digits, at most maxPendingEvent.
func readChunkSize(br *bufio.Reader) (int, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	hex := bytes.TrimRight(line, "\r\n")
	if i := bytes.IndexByte(hex, ';'); i >= 0 {
		hex = hex[:i]
	}
	hex = bytes.TrimSpace(hex)
	if len(hex) == 0 || len(hex) > 8 {
		return 0, fmt.Errorf("bad chunk size %q", line)
	}
	size := 0
	for _, b := range hex {
		var d byte
		switch {
		case b >= '0' && b <= '9':
			d = b - '0'
		case b >= 'a' && b <= 'f':
			d = b - 'a' + 10
		case b >= 'A' && b <= 'F':
			d = b - 'A' + 10
		default:
			return 0, fmt.Errorf("bad chunk size %q", line)
		}
		size = size<<4 | int(d)
	}
	if size > maxPendingEvent {
		return 0, fmt.Errorf("chunk of %d bytes, over %d", size, maxPendingEvent)
	}
	return size, nil
}

// parseEventTime reads the send time, Unix nanoseconds, from the first
// "t": field of a timed event (timedEvent): 1 to 19 digits, positive, at
// most math.MaxInt64.
func parseEventTime(ev []byte) (int64, bool) {
	i := bytes.Index(ev, []byte(`"t":`))
	if i < 0 {
		return 0, false
	}
	var v uint64
	n := 0
	for _, b := range ev[i+4:] {
		if b < '0' || b > '9' {
			break
		}
		if n++; n > 19 {
			return 0, false
		}
		v = v*10 + uint64(b-'0') // 19 digits fit in a uint64
	}
	if n == 0 || v == 0 || v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}
