package trace

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"

	"github.com/warmroute/warmroute/loadtest/workload"
)

// Kind is the workload kind of replayed requests.
const Kind workload.Kind = "trace"

// ReplayConfig says how records become requests and when they are sent.
type ReplayConfig struct {
	// Model is the request's "model" ("" leaves it out).
	Model string
	// BlockTokens is the tokens per hash id (512 in Mooncake's traces);
	// BytesPerToken the bytes of prompt text per token (gpusim's
	// --bytes-per-token, 4). A block is BlockTokens x BytesPerToken bytes
	// of text.
	BlockTokens, BytesPerToken int
	// MaxHashIDs bounds a record's hash ids, as in ParseConfig.
	MaxHashIDs int
	// TimeScale divides trace time: 10 replays ten seconds of the trace
	// in one.
	TimeScale float64
	// WindowStart and Window select the records with WindowStart <=
	// timestamp < WindowStart + Window, in trace time (Window 0: to the
	// end). Arrivals are measured from WindowStart.
	WindowStart, Window time.Duration
	// MaxRequests keeps the first MaxRequests records of the window (0:
	// all).
	MaxRequests int
	// MaxTokens caps max_tokens, which is otherwise the record's
	// output_length (at least 1).
	MaxTokens int
	// Stream asks for SSE answers with usage in the last chunk.
	Stream bool
}

// DefaultReplayConfig returns Mooncake's block size, gpusim's bytes per
// token, real time, the whole trace, and answers capped at 128 tokens.
func DefaultReplayConfig() ReplayConfig {
	return ReplayConfig{
		BlockTokens:   DefaultBlockTokens,
		BytesPerToken: 4,
		MaxHashIDs:    DefaultMaxHashIDs,
		TimeScale:     1,
		MaxTokens:     128,
		Stream:        true,
	}
}

// Validate reports the first problem with c.
func (c ReplayConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.BlockTokens < 1 || c.BlockTokens > 1<<16:
		return bad("block tokens %d outside 1-65536", c.BlockTokens)
	case c.BytesPerToken < 1 || c.BytesPerToken > 64:
		return bad("bytes per token %d outside 1-64", c.BytesPerToken)
	case c.MaxHashIDs < 1 || c.MaxHashIDs > 1<<20:
		return bad("max hash ids %d outside 1-%d", c.MaxHashIDs, 1<<20)
	case !(c.TimeScale > 0) || c.TimeScale > 1e6:
		return bad("time scale %g outside (0, 1e6]", c.TimeScale)
	case c.WindowStart < 0 || c.Window < 0:
		return bad("negative window")
	case c.MaxRequests < 0:
		return bad("max requests %d < 0", c.MaxRequests)
	case c.MaxTokens < 1 || c.MaxTokens > maxOutputLength:
		return bad("max tokens %d outside 1-%d", c.MaxTokens, maxOutputLength)
	}
	return nil
}

// Replay yields a trace's requests in time order, each with its send time.
// It is not safe for concurrent use.
type Replay struct {
	cfg   ReplayConfig
	recs  []Record
	at    []time.Duration
	model []byte // JSON string, or nil
	next  int
}

// NewReplay selects the records of c's window in time order (ties in file
// order) and checks each as Parse does. A window without records is an
// error.
func NewReplay(recs []Record, c ReplayConfig) (*Replay, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	order := make([]int, len(recs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return recs[order[a]].Timestamp < recs[order[b]].Timestamp })
	p := &Replay{cfg: c}
	for _, i := range order {
		r := recs[i]
		if r.Timestamp < c.WindowStart || c.Window > 0 && r.Timestamp-c.WindowStart >= c.Window {
			continue
		}
		if c.MaxRequests > 0 && len(p.recs) == c.MaxRequests {
			break
		}
		if err := checkRecord(&r, c.BlockTokens, c.MaxHashIDs); err != nil {
			return nil, &LineError{r.Line, err}
		}
		p.recs = append(p.recs, r)
		p.at = append(p.at, time.Duration(float64(r.Timestamp-c.WindowStart)/c.TimeScale))
	}
	if len(p.recs) == 0 {
		return nil, fmt.Errorf("%w: no record in the window (%d records, window %v from %v)", ErrBadConfig, len(recs), c.Window, c.WindowStart)
	}
	if c.Model != "" {
		p.model, _ = json.Marshal(c.Model)
	}
	return p, nil
}

// Len returns the number of requests.
func (p *Replay) Len() int { return len(p.recs) }

// Span returns the last request's send time.
func (p *Replay) Span() time.Duration { return p.at[len(p.at)-1] }

// Records returns the selected records in send order (shared, not to be
// modified).
func (p *Replay) Records() []Record { return p.recs }

// NextAt renders the next request into r, reusing r.Body's storage, and
// returns its send time from the start of the replay; false after the
// last request.
func (p *Replay) NextAt(r *workload.Request) (time.Duration, bool) {
	if p.next >= len(p.recs) {
		return 0, false
	}
	i := p.next
	p.next++
	p.render(r, i)
	return p.at[i], true
}

// Next renders the next request into r ignoring its time; after the last
// request it starts over from the first.
func (p *Replay) Next(r *workload.Request) {
	if p.next >= len(p.recs) {
		p.next = 0
	}
	p.render(r, p.next)
	p.next++
}

func (p *Replay) render(r *workload.Request, i int) {
	rec := &p.recs[i]
	*r = workload.Request{Seq: i, Kind: Kind, Path: workload.PathCompletions, Body: p.appendBody(r.Body[:0], rec)}
}

// appendBody renders rec as a /v1/completions body.
func (p *Replay) appendBody(b []byte, rec *Record) []byte {
	b = append(b, '{')
	if p.model != nil {
		b = append(b, `"model":`...)
		b = append(b, p.model...)
		b = append(b, ',')
	}
	b = append(b, `"prompt":"`...)
	b = AppendPrompt(b, rec, p.cfg.BlockTokens, p.cfg.BytesPerToken)
	b = append(b, `","max_tokens":`...)
	b = strconv.AppendInt(b, int64(min(max(rec.OutputLength, 1), p.cfg.MaxTokens)), 10)
	if p.cfg.Stream {
		b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	return append(b, '}')
}

// AppendPrompt appends rec's prompt text: for each hash id in turn, the
// block of text that id names (blockTokens x bytesPerToken bytes), the
// whole cut to InputLength x bytesPerToken bytes. A record with one hash
// id fewer than its blocks ends with a block of its own, named after its
// Line. The text is lowercase ASCII words, so it needs no JSON escaping.
func AppendPrompt(dst []byte, rec *Record, blockTokens, bytesPerToken int) []byte {
	blockBytes := blockTokens * bytesPerToken
	left := rec.InputLength * bytesPerToken
	for k := 0; left > 0; k++ {
		n := min(blockBytes, left)
		if k < len(rec.HashIDs) {
			dst = AppendBlock(dst, rec.HashIDs[k], n)
		} else {
			dst = appendText(dst, "[tail ", int64(rec.Line), n)
		}
		left -= n
	}
	return dst
}

// AppendBlock appends the first n bytes of the text block of hash id id.
// The text depends on id alone and differs from any other id's from its
// first bytes, "[id] ".
func AppendBlock(dst []byte, id int64, n int) []byte {
	return appendText(dst, "[", id, n)
}

// Letters of the pseudo-words.
const (
	consonants = "bcdfghjklmnprstvwz"
	vowels     = "aeiou"
)

// appendText appends n bytes: tag, id, "] ", then pseudo-words of one to
// three syllables drawn from a generator seeded by (tag, id).
func appendText(dst []byte, tag string, id int64, n int) []byte {
	start := len(dst)
	dst = append(dst, tag...)
	dst = strconv.AppendInt(dst, id, 10)
	dst = append(dst, "] "...)
	seed := uint64(id)*0x9e3779b97f4a7c15 + uint64(len(tag))
	var src rand.PCG
	src.Seed(seed, seed^0x7472616365626c6b)
	for len(dst)-start < n {
		x := src.Uint64()
		syl := 1 + int(x%3)
		x /= 3
		for s := 0; s < syl; s++ {
			dst = append(dst, consonants[x%uint64(len(consonants))])
			x /= uint64(len(consonants))
			dst = append(dst, vowels[x%uint64(len(vowels))])
			x /= uint64(len(vowels))
		}
		if x%11 == 0 {
			dst = append(dst, ". "...)
		} else {
			dst = append(dst, ' ')
		}
	}
	return dst[:start+n]
}
