package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// Error kinds counted in a Summary.
const (
	ErrKindConnect  = "connect"   // the connection was refused or reset before an answer
	ErrKindTimeout  = "timeout"   // the request exceeded Config.Timeout
	ErrKindStream   = "stream"    // the stream broke or ended without [DONE]
	ErrKindSSEError = "sse_error" // the stream carried an error object
	ErrKindCanceled = "canceled"  // still running when the run stopped
	ErrKindOther    = "other"
	// Non-200 answers are counted as "http_<status>".
)

// client sends requests and reads their answers.
type client struct {
	hc             *http.Client
	backendHeader  string
	decisionHeader string
	readers        sync.Pool // *bufio.Reader
	// aliases maps X-Gpusim-Instance names to backend ids; set before the
	// run starts, read-only afterwards.
	aliases map[string]string
}

func newClient(cfg *Config, conns int) *client {
	tr := &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        conns + 16,
		MaxIdleConnsPerHost: conns + 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      16 << 10,
	}
	return &client{
		hc:             &http.Client{Transport: tr},
		backendHeader:  cfg.BackendHeader,
		decisionHeader: cfg.DecisionHeader,
		readers:        sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 32<<10) }},
	}
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// do sends one request and fills o, whose ITL storage it reuses (o must
// otherwise be zero). Latencies are measured from intended.
// ctx carries the per-request timeout; stop is the run's context, whose
// cancellation marks the request "canceled" rather than failed.
func (c *client) do(ctx, stop context.Context, base string, r *workload.Request, intended time.Time, o *stats.Outcome) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		o.Err = ErrKindOther
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream, application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		o.Err = classify(err, stop)
		return
	}
	defer resp.Body.Close()
	o.Backend = resp.Header.Get(c.backendHeader)
	if o.Backend == "" {
		o.Backend = resp.Header.Get(HeaderGpusimInstance)
		if id, ok := c.aliases[o.Backend]; ok {
			o.Backend = id
		}
	}
	o.Decision = resp.Header.Get(c.decisionHeader)
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		o.Err = "http_" + strconv.Itoa(resp.StatusCode)
		return
	}
	ct := resp.Header.Get("Content-Type")
	if len(ct) >= 17 && ct[:17] == "text/event-stream" {
		c.readStream(resp.Body, stop, cancel, intended, o)
		return
	}
	c.readWhole(resp.Body, stop, intended, o)
}

// drainAfterDone bounds the wait for the end of a stream after [DONE].
const drainAfterDone = 250 * time.Millisecond

func (c *client) readStream(body io.Reader, stop context.Context, cancel context.CancelFunc, intended time.Time, o *stats.Outcome) {
	br := c.readers.Get().(*bufio.Reader)
	br.Reset(body)
	defer func() { br.Reset(nil); c.readers.Put(br) }()
	o.ITL = o.ITL[:0]

	var (
		u        usage
		hasUsage bool
		chunks   int
		last     time.Time
		long     []byte // a line longer than the reader's buffer
	)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			ev, hu := parseLine(line, &u)
			hasUsage = hasUsage || hu
			switch ev {
			case evContent:
				now := time.Now()
				if chunks == 0 {
					o.TTFT = now.Sub(intended)
				} else {
					o.ITL = append(o.ITL, now.Sub(last))
				}
				last = now
				chunks++
			case evError:
				o.Err = ErrKindSSEError
				return
			case evDone:
				o.E2E = time.Since(intended)
				if chunks == 0 {
					o.TTFT = o.E2E
				}
				c.fillUsage(o, &u, hasUsage, chunks)
				// Read to the end of the body, which normally follows at
				// once, so the connection can be reused; a server that
				// keeps the stream open is cut off.
				t := time.AfterFunc(drainAfterDone, cancel)
				_, _ = io.Copy(io.Discard, io.LimitReader(br, 64<<10))
				t.Stop()
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				o.Err = ErrKindStream
			} else {
				o.Err = classify(err, stop)
			}
			return
		}
	}
}

func (c *client) fillUsage(o *stats.Outcome, u *usage, has bool, chunks int) {
	if has {
		o.PromptTokens = u.PromptTokens
		o.CompletionTokens = u.CompletionTokens
		o.CachedTokens = u.cached()
		return
	}
	o.CompletionTokens = chunks
}

func (c *client) readWhole(body io.Reader, stop context.Context, intended time.Time, o *stats.Outcome) {
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(body, 16<<20)); err != nil {
		o.Err = classify(err, stop)
		return
	}
	o.E2E = time.Since(intended)
	o.TTFT = o.E2E
	var v struct {
		Usage *usage          `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(b.Bytes(), &v); err != nil {
		o.Err = ErrKindStream
		return
	}
	if len(v.Error) > 0 && string(v.Error) != "null" {
		o.Err = ErrKindSSEError
		return
	}
	if v.Usage != nil {
		c.fillUsage(o, v.Usage, true, 0)
	}
}

// classify maps a transport error to an error kind.
func classify(err error, stop context.Context) string {
	switch {
	case stop.Err() != nil:
		return ErrKindCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return ErrKindTimeout
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return ErrKindConnect
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return ErrKindStream
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrKindTimeout
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return ErrKindConnect
	}
	return ErrKindOther
}
