package reqlog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/ring"
)

// MaxModelBytes is the longest model name kept; longer names are cut.
const MaxModelBytes = 96

// DefaultQueueLen is the records in flight at most (taken by requests, or
// queued for the writer) when Config.QueueLen is 0.
const DefaultQueueLen = 4096

// Output names accepted by Config.AccessLog besides a file path.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Access log formats.
const (
	FormatJSON = "json"
	FormatText = "text"
)

// Config says what to write. The zero value writes nothing.
type Config struct {
	// AccessSample is the share of requests that get an access log line:
	// 0 none, 1 every one, 0.01 one in a hundred (chosen at random).
	AccessSample float64
	// AccessFormat is FormatJSON or FormatText.
	AccessFormat string
	// AccessLog is Stdout, Stderr or a file path (appended to).
	AccessLog string

	// RecordPath, when set, receives every routed request as a trace
	// record. An existing file is renamed to RecordPath+".1" first, so a
	// restart never mixes two recordings' time bases in one file.
	RecordPath string
	// RecordMaxBytes and RecordMaxRecords bound the recording; at either
	// bound recording stops (0: no bound).
	RecordMaxBytes   int64
	RecordMaxRecords int

	// QueueLen bounds the records in flight (default DefaultQueueLen).
	QueueLen int

	// Registry receives the metrics; Logger hears about failed writes and
	// the end of a recording.
	Registry prometheus.Registerer
	Logger   *slog.Logger

	// Stdout and Stderr replace os.Stdout and os.Stderr (tests).
	Stdout, Stderr io.Writer
}

// Enabled reports whether c writes anything.
func (c *Config) Enabled() bool { return c.AccessSample > 0 || c.RecordPath != "" }

// Validate reports every unusable setting, joined.
func (c *Config) Validate() error {
	var errs []error
	if !(c.AccessSample >= 0 && c.AccessSample <= 1) {
		errs = append(errs, fmt.Errorf("access log sample %v outside [0, 1]", c.AccessSample))
	}
	if c.AccessSample > 0 {
		if c.AccessFormat != FormatJSON && c.AccessFormat != FormatText {
			errs = append(errs, fmt.Errorf("access log format %q: want json or text", c.AccessFormat))
		}
		if c.AccessLog == "" {
			errs = append(errs, errors.New("access log output is empty: want stdout, stderr or a file path"))
		}
	}
	if c.RecordMaxBytes < 0 || c.RecordMaxRecords < 0 {
		errs = append(errs, errors.New("trace recording bounds must not be negative"))
	}
	if c.QueueLen < 0 || c.QueueLen > 1<<20 {
		errs = append(errs, fmt.Errorf("request log queue %d outside [0, %d]", c.QueueLen, 1<<20))
	}
	return errors.Join(errs...)
}

// Record is what the router saw of one request. The request path fills
// it between Begin and Submit and must not touch it afterwards.
type Record struct {
	// Start is when the request arrived.
	Start time.Time
	// Route is the endpoint path (a constant string; "other" for
	// unknown paths).
	Route string
	// Backend is the id of the backend that answered, Decision why it
	// was picked (ring.Reason's names); both "" when none did.
	Backend, Decision string
	// Status is the HTTP status sent to the client.
	Status int
	// BytesIn is the request body's size, BytesOut the response body's.
	BytesIn, BytesOut int64
	// TTFB is from sending to the backend to its first body byte, or -1
	// when no backend answered. Duration is from arrival to the end of
	// the answer.
	TTFB, Duration time.Duration

	tenant    uint64
	hasTenant bool
	model     [MaxModelBytes]byte
	modelLen  uint8
	access    bool
	trace     bool

	// The trace record's part (TraceWanted).

	// PromptTokens and CompletionTokens are the backend's usage report,
	// or -1 when it sent none.
	PromptTokens, CompletionTokens int64
	// TextBytes is the canonical prompt text read for the block chain (at
	// most ring.MaxChainBlocks blocks); BodyBytes the body's size, the
	// estimate's base when the text was longer.
	TextBytes, BodyBytes int
	// Blocks is the full blocks in Chain; Chain[k] is the key of the
	// first k+1 blocks (ring.KeyInfo.KeyAt), Tail the key of all the text
	// read.
	Blocks int
	Chain  [ring.MaxChainBlocks]uint64
	Tail   uint64
}

// SetModel keeps the model name (cut at MaxModelBytes).
func (r *Record) SetModel(m []byte) { r.modelLen = uint8(copy(r.model[:], m)) }

// SetTenant keeps a hash of the tenant; nil or empty means none.
func (r *Record) SetTenant(t []byte) {
	r.hasTenant = len(t) > 0
	if r.hasTenant {
		r.tenant = xxhash.Sum64(t)
	}
}

// SetChain keeps the block chain of info, read from body with
// ChainBlocks = ring.MaxChainBlocks, and the body's size. When the text
// goes on past the chain, Tail also covers the whole body, so that the
// ids past the chain (see HashID) are shared only by equal bodies, never
// by prompts that merely open with the same 64 KiB.
func (r *Record) SetChain(info *ring.KeyInfo, body []byte) {
	r.Blocks = min(info.Blocks, len(r.Chain))
	for d := 0; d < r.Blocks; d++ {
		r.Chain[d] = info.KeyAt(d)
	}
	r.Tail = info.KeyAt(r.Blocks)
	r.TextBytes, r.BodyBytes = info.PrefixBytes, len(body)
	if r.TextBytes >= ring.MaxChainBlocks*ring.ChainBlockBytes {
		r.Tail = splitmix(r.Tail ^ xxhash.Sum64(body))
	}
}

// TraceWanted reports whether r becomes a trace record: the request path
// then fills the chain and the token counts.
func (r *Record) TraceWanted() bool { return r.trace }

// SkipTrace drops r's trace record (a request that was never routed).
func (r *Record) SkipTrace() { r.trace = false }

// Log takes records from the request path and writes them on its own
// goroutine. Create it with New, stop it with Close.
type Log struct {
	cfg    Config
	log    *slog.Logger
	sample float64

	free  chan *Record // records not in use
	queue chan *Record // records to write; never fuller than free's capacity

	access     *bufio.Writer
	accessFile *os.File // nil for stdout/stderr
	json       bool

	recording atomic.Bool
	t0        atomic.Int64 // the first recorded request's arrival (UnixNano), 0 before
	recFile   *os.File
	rec       *bufio.Writer
	recBytes  int64
	recCount  int
	recIDs    int

	written, dropped [numOutputs]prometheus.Counter

	buf   []byte
	stop  chan struct{}
	done  chan struct{}
	close sync.Once
}

const (
	outAccess = iota
	outTrace
	numOutputs
)

var outputNames = [numOutputs]string{"access", "trace"}

// New opens the outputs and starts the writer; nil, nil when cfg writes
// nothing.
func New(cfg Config) (_ *Log, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, nil
	}
	n := cfg.QueueLen
	if n == 0 {
		n = DefaultQueueLen
	}
	l := &Log{cfg: cfg, log: cfg.Logger, sample: cfg.AccessSample, json: cfg.AccessFormat == FormatJSON,
		free: make(chan *Record, n), queue: make(chan *Record, n),
		stop: make(chan struct{}), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			l.closeFiles()
		}
	}()
	if cfg.AccessSample > 0 {
		var w io.Writer
		switch cfg.AccessLog {
		case Stdout:
			w = cmpWriter(cfg.Stdout, os.Stdout)
		case Stderr:
			w = cmpWriter(cfg.Stderr, os.Stderr)
		default:
			f, err := os.OpenFile(cfg.AccessLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
			if err != nil {
				return nil, fmt.Errorf("access log: %w", err)
			}
			l.accessFile, w = f, f
		}
		l.access = bufio.NewWriterSize(w, 64<<10)
	}
	if cfg.RecordPath != "" {
		if _, err := os.Stat(cfg.RecordPath); err == nil {
			if err := os.Rename(cfg.RecordPath, cfg.RecordPath+".1"); err != nil {
				return nil, fmt.Errorf("trace recording: keeping the previous recording: %w", err)
			}
		}
		f, err := os.OpenFile(cfg.RecordPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
		if err != nil {
			return nil, fmt.Errorf("trace recording: %w", err)
		}
		l.recFile, l.rec = f, bufio.NewWriterSize(f, 64<<10)
		l.recording.Store(true)
	}
	written := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmroute_request_log_written_total",
		Help: "Lines written by output: access (the access log), trace (the trace recording).",
	}, []string{"output"})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmroute_request_log_dropped_total",
		Help: "Lines lost by output (access, trace): the writer was behind (every record in use) or the write failed. Requests never wait for the writer.",
	}, []string{"output"})
	for o := range numOutputs {
		l.written[o] = written.WithLabelValues(outputNames[o])
		l.dropped[o] = dropped.WithLabelValues(outputNames[o])
	}
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(written); err != nil {
			return nil, err
		}
		if err := cfg.Registry.Register(dropped); err != nil {
			cfg.Registry.Unregister(written)
			return nil, err
		}
	}
	for range n {
		l.free <- new(Record)
	}
	go l.run()
	return l, nil
}

func cmpWriter(w, def io.Writer) io.Writer {
	if w != nil {
		return w
	}
	return def
}

// Begin returns a record for a request arriving at now, or nil when the
// request gets no line (not sampled, nothing recorded) or every record is
// in use (counted as dropped). It never blocks or allocates. Safe on a
// nil Log.
func (l *Log) Begin(now time.Time) *Record {
	if l == nil {
		return nil
	}
	access := l.sample >= 1 || (l.sample > 0 && rand.Float64() < l.sample)
	trace := l.recording.Load()
	if !access && !trace {
		return nil
	}
	var r *Record
	select {
	case r = <-l.free:
	default:
		if access {
			l.dropped[outAccess].Inc()
		}
		if trace {
			l.dropped[outTrace].Inc()
		}
		return nil
	}
	if trace && l.t0.Load() == 0 {
		l.t0.CompareAndSwap(0, now.UnixNano())
	}
	r.reset(now, access, trace)
	return r
}

func (r *Record) reset(now time.Time, access, trace bool) {
	// Chain is written before it is read (up to Blocks): not cleared.
	r.Start, r.Route, r.Backend, r.Decision = now, "", "", ""
	r.Status, r.BytesIn, r.BytesOut, r.TTFB, r.Duration = 0, 0, 0, -1, 0
	r.tenant, r.hasTenant, r.modelLen = 0, false, 0
	r.access, r.trace = access, trace
	r.PromptTokens, r.CompletionTokens = -1, -1
	r.TextBytes, r.BodyBytes, r.Blocks, r.Tail = 0, 0, 0, 0
}

// Submit hands r, filled, to the writer. It never blocks: every record
// in use fits the queue.
func (l *Log) Submit(r *Record) {
	select {
	case l.queue <- r:
	default: // cannot happen: the queue holds every record
	}
}

// Close stops the writer after it wrote what was submitted, and closes
// the files. Safe to call more than once and on a nil Log.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.close.Do(func() { close(l.stop) })
	<-l.done
	return nil
}

func (l *Log) run() {
	defer close(l.done)
	for {
		select {
		case r := <-l.queue:
			l.write(r)
			if len(l.queue) == 0 {
				l.flush()
			}
		case <-l.stop:
			for {
				select {
				case r := <-l.queue:
					l.write(r)
					continue
				default:
				}
				break
			}
			l.flush()
			l.closeFiles()
			return
		}
	}
}

func (l *Log) write(r *Record) {
	if r.access && l.access != nil {
		if l.json {
			l.buf = appendJSON(l.buf[:0], r)
		} else {
			l.buf = appendText(l.buf[:0], r)
		}
		if _, err := l.access.Write(l.buf); err != nil {
			l.dropped[outAccess].Inc()
		} else {
			l.written[outAccess].Inc()
		}
	}
	if r.trace && l.rec != nil {
		l.writeTrace(r)
	}
	l.free <- r
}

func (l *Log) writeTrace(r *Record) {
	if !l.recording.Load() {
		return // stopped at a bound; records taken before still arrive
	}
	ts := r.Start.UnixNano() - l.t0.Load()
	if ts > int64(MaxTimestamp) {
		l.endRecording("the recording reached its longest timestamp", MaxTimestamp.String())
		return
	}
	if l.cfg.RecordMaxRecords > 0 && l.recCount >= l.cfg.RecordMaxRecords {
		l.endRecording("the recording reached its record limit", fmt.Sprint(l.cfg.RecordMaxRecords))
		return
	}
	ids := r.HashIDs()
	if l.recIDs+ids > MaxTotalHashIDs {
		l.endRecording("the recording reached its hash id limit", fmt.Sprint(MaxTotalHashIDs))
		return
	}
	l.buf = AppendTrace(l.buf[:0], r, time.Duration(max(ts, 0)))
	if l.cfg.RecordMaxBytes > 0 && l.recBytes+int64(len(l.buf)) > l.cfg.RecordMaxBytes {
		l.endRecording("the recording reached its size limit", fmt.Sprint(l.cfg.RecordMaxBytes))
		return
	}
	if _, err := l.rec.Write(l.buf); err != nil {
		l.dropped[outTrace].Inc()
		l.endRecording("writing the recording failed", err.Error())
		return
	}
	l.recBytes += int64(len(l.buf))
	l.recCount++
	l.recIDs += ids
	l.written[outTrace].Inc()
}

// endRecording stops the recording; the file keeps what was written.
func (l *Log) endRecording(why, detail string) {
	if !l.recording.Swap(false) {
		return
	}
	if err := l.rec.Flush(); err != nil {
		l.log.Warn("trace recording", "err", err)
	}
	l.log.Info("trace recording stopped: "+why, "limit", detail, "records", l.recCount, "bytes", l.recBytes, "file", l.cfg.RecordPath)
}

func (l *Log) flush() {
	if l.access != nil {
		if err := l.access.Flush(); err != nil {
			l.log.Warn("access log", "err", err)
			l.access.Reset(io.Discard)
		}
	}
	if l.rec != nil && l.recording.Load() {
		if err := l.rec.Flush(); err != nil {
			l.log.Warn("trace recording", "err", err)
			l.endRecording("writing the recording failed", err.Error())
		}
	}
}

func (l *Log) closeFiles() {
	for _, f := range []*os.File{l.accessFile, l.recFile} {
		if f != nil {
			if err := f.Close(); err != nil {
				l.log.Warn("request log", "err", err, "file", f.Name())
			}
		}
	}
}
