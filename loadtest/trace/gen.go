package trace

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// GenConfig shapes a synthetic trace: conversations and questions on
// shared documents, every request opening with the same system prompt (hash
// id 0, one block).
//
// Conversations start as a Poisson process; each has 1 to 2*Turns-1 turns
// (uniformly, Turns on average) separated by exponential think times of
// mean Think, and each turn resends the previous turn's prompt plus new
// text: its hash_ids keep the previous turn's full blocks and add new ones
// (the previous turn's partial last block is rewritten, so it gets a new
// id, as in Mooncake's traces). DocShare of the requests are instead a
// question on one of Documents documents (uniformly chosen) of the same
// length: the system prompt, the document's blocks, then the question's.
// Sizes are drawn so that the mean input is about MeanInputTokens; output
// lengths are uniform on 1 to 2*MeanOutputTokens-1.
//
// The process runs from well before the trace starts (2*Turns-1 think
// times), so the trace opens in the steady state, with conversations part
// way through, as a slice of a real service would.
type GenConfig struct {
	Seed uint64
	// Requests is the number of records; Rate their arrivals per second
	// of trace time.
	Requests int
	Rate     float64
	// BlockTokens is the tokens per hash id (512 in Mooncake's traces).
	BlockTokens int
	// MeanInputTokens and MeanOutputTokens are the mean prompt and answer
	// lengths. Mooncake's conversation trace averages about 12,000 input
	// tokens; the default is 3,000, which a 2-core machine can simulate.
	MeanInputTokens, MeanOutputTokens int
	// Turns is the mean number of turns per conversation, Think the mean
	// time between two turns of one conversation.
	Turns int
	Think time.Duration
	// DocShare is the share of requests on shared documents, Documents
	// their number.
	DocShare  float64
	Documents int
}

// DefaultGenConfig returns 1,200 requests at 20 per second (a minute),
// 3,000 input tokens on average, conversations of 5 turns 8 s apart, and
// a quarter of the requests on 48 documents. Replayed on the demo fleet (7
// gpusim instances of 96,000 tokens of KV cache) its working set is
// several times one instance's cache.
func DefaultGenConfig() GenConfig {
	return GenConfig{
		Seed:             1,
		Requests:         1200,
		Rate:             20,
		BlockTokens:      DefaultBlockTokens,
		MeanInputTokens:  3000,
		MeanOutputTokens: 256,
		Turns:            5,
		Think:            8 * time.Second,
		DocShare:         0.25,
		Documents:        48,
	}
}

// Validate reports the first problem with c.
func (c GenConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Requests < 1 || c.Requests > 1<<20:
		return bad("requests %d outside 1-%d", c.Requests, 1<<20)
	case !(c.Rate > 0) || c.Rate > 1e4:
		return bad("rate %g outside (0, 10000]", c.Rate)
	case c.BlockTokens < 1 || c.BlockTokens > 1<<16:
		return bad("block tokens %d outside 1-65536", c.BlockTokens)
	case c.MeanInputTokens < 2*c.BlockTokens || c.MeanInputTokens > DefaultMaxHashIDs*c.BlockTokens/8:
		return bad("mean input %d tokens outside %d-%d (2 to %d blocks)", c.MeanInputTokens,
			2*c.BlockTokens, DefaultMaxHashIDs*c.BlockTokens/8, DefaultMaxHashIDs/8)
	case c.MeanOutputTokens < 1 || c.MeanOutputTokens > maxOutputLength/2:
		return bad("mean output %d tokens outside 1-%d", c.MeanOutputTokens, maxOutputLength/2)
	case c.Turns < 1 || c.Turns > 64:
		return bad("turns %d outside 1-64", c.Turns)
	case c.Think <= 0 || c.Think > time.Hour:
		return bad("think time %v outside (0, 1h]", c.Think)
	case !(c.DocShare >= 0 && c.DocShare <= 1):
		return bad("document share %g outside [0, 1]", c.DocShare)
	case c.Documents < 1 || c.Documents > 100000:
		return bad("documents %d outside 1-100000", c.Documents)
	}
	return nil
}

// genEvent is a request of the process, before the trace is cut out.
type genEvent struct {
	t   float64 // seconds
	seq int
	rec Record
}

// sizes are the mean lengths the process draws around.
type sizes struct {
	system, first, growth, docBlocks, question, cap int
}

func (c *GenConfig) sizes() sizes {
	b := c.BlockTokens
	rest := float64(c.MeanInputTokens - b)
	// A request-weighted turn index of a conversation with 1..2T-1 turns
	// is 2(T-1)/3 on average; first message and growth per turn are
	// equal, so S + F + 2(T-1)/3 x F = MeanInputTokens.
	f := rest / (1 + 2*float64(c.Turns-1)/3)
	docBlocks := max(1, int(math.Round(0.75*rest/float64(b))))
	return sizes{
		system:    b,
		first:     max(1, int(f)),
		growth:    max(1, int(f)),
		docBlocks: docBlocks,
		question:  max(b/8, 1, c.MeanInputTokens-b-docBlocks*b),
		cap:       min(DefaultMaxHashIDs*b, 32*c.MeanInputTokens),
	}
}

// Generate returns the synthetic trace of c: Requests records in time
// order, the first at 0 ms, hash ids numbered by first appearance from 0
// (the system prompt). The same c gives the same records.
func Generate(c GenConfig) ([]Record, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	horizon := 1.2*float64(c.Requests)/c.Rate + 1
	for range 24 {
		evs := c.process(horizon)
		if len(evs) >= c.Requests && evs[c.Requests-1].t < horizon {
			return finish(evs[:c.Requests]), nil
		}
		horizon *= 2
	}
	return nil, errors.New("trace: generator: too few requests (a bug)")
}

// process returns the requests of the process from time 0 up to at least
// horizon, sorted. Every request before horizon is there: a longer
// horizon only adds later ones.
func (c *GenConfig) process(horizon float64) []genEvent {
	s := c.sizes()
	b := c.BlockTokens
	think := c.Think.Seconds()
	burn := float64(2*c.Turns-1) * think
	var (
		evs  []genEvent
		seq  int
		next int64 = 1 // hash id 0 is the system prompt
	)
	fresh := func(ids []int64, n int) []int64 {
		for range n {
			ids = append(ids, next)
			next++
		}
		return ids
	}
	around := func(r *rand.Rand, mean int) int { return max(1, mean/2+r.IntN(mean+1)) }
	output := func(r *rand.Rand) int { return 1 + r.IntN(2*c.MeanOutputTokens-1) }
	blocks := func(tokens int) int { return (tokens + b - 1) / b }
	emit := func(t float64, in, out int, ids []int64) {
		if t >= 0 {
			evs = append(evs, genEvent{t: t, seq: seq, rec: Record{InputLength: in, OutputLength: out, HashIDs: append([]int64(nil), ids...)}})
		}
		seq++
	}

	if rate := c.Rate * (1 - c.DocShare) / float64(c.Turns); rate > 0 {
		r := rand.New(rand.NewPCG(c.Seed, 0x636f6e766572736e)) // "conversn"
		var ids []int64
		for t := -burn + r.ExpFloat64()/rate; t < horizon; t += r.ExpFloat64() / rate {
			turns := 1 + r.IntN(2*c.Turns-1)
			in := s.system + around(r, s.first)
			ids = fresh(append(ids[:0], 0), blocks(in)-1)
			at := t
			for k := range turns {
				if k > 0 {
					at += r.ExpFloat64() * think
					grown := in + around(r, s.growth)
					if grown > s.cap {
						break
					}
					keep := in / b
					in = grown
					ids = fresh(ids[:keep], blocks(in)-keep)
				}
				emit(at, in, output(r), ids)
			}
		}
	}
	if rate := c.Rate * c.DocShare; rate > 0 {
		r := rand.New(rand.NewPCG(c.Seed, 0x646f63756d656e74)) // "document"
		docs := make([][]int64, c.Documents)
		var ids []int64
		for t := -burn + r.ExpFloat64()/rate; t < horizon; t += r.ExpFloat64() / rate {
			d := r.IntN(c.Documents)
			if docs[d] == nil {
				docs[d] = fresh(nil, s.docBlocks)
			}
			in := s.system + s.docBlocks*b + around(r, s.question)
			ids = append(append(ids[:0], 0), docs[d]...)
			ids = fresh(ids, blocks(in)-len(ids))
			emit(t, in, output(r), ids)
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].seq < evs[j].seq
	})
	return evs
}

// finish turns the first requests into records: times in milliseconds
// from the first, hash ids renumbered by first appearance.
func finish(evs []genEvent) []Record {
	t0 := evs[0].t
	ids := make(map[int64]int64)
	out := make([]Record, len(evs))
	for i, e := range evs {
		r := e.rec
		r.Line = i + 1
		r.Timestamp = time.Duration(math.Floor((e.t-t0)*1000)) * time.Millisecond
		for j, id := range r.HashIDs {
			n, ok := ids[id]
			if !ok {
				n = int64(len(ids))
				ids[id] = n
			}
			r.HashIDs[j] = n
		}
		out[i] = r
	}
	return out
}

// Stats describes a trace.
type Stats struct {
	Records int
	// Span is the last timestamp.
	Span time.Duration
	// MeanInput, MaxInput and MeanOutput are in tokens.
	MeanInput, MeanOutput float64
	MaxInput              int
	// DistinctIDs counts different hash ids: the working set, in blocks.
	DistinctIDs int
	// SharedFirst is the share of records whose first hash id is the
	// most common first hash id (a shared system prompt).
	SharedFirst float64
}

// Describe returns recs' Stats.
func Describe(recs []Record) Stats {
	s := Stats{Records: len(recs)}
	if len(recs) == 0 {
		return s
	}
	ids := make(map[int64]struct{})
	first := make(map[int64]int)
	var in, out float64
	for i := range recs {
		r := &recs[i]
		s.Span = max(s.Span, r.Timestamp)
		in += float64(r.InputLength)
		out += float64(r.OutputLength)
		s.MaxInput = max(s.MaxInput, r.InputLength)
		for _, id := range r.HashIDs {
			ids[id] = struct{}{}
		}
		if len(r.HashIDs) > 0 {
			first[r.HashIDs[0]]++
		}
	}
	top := 0
	for _, n := range first {
		top = max(top, n)
	}
	s.MeanInput = in / float64(len(recs))
	s.MeanOutput = out / float64(len(recs))
	s.DistinctIDs = len(ids)
	s.SharedFirst = float64(top) / float64(len(recs))
	return s
}

// String describes s in one line, with blocks of blockTokens.
func (s Stats) Format(blockTokens int) string {
	return fmt.Sprintf("%d requests over %.1fs, input %.0f tokens on average (max %d), output %.0f, %d distinct blocks of %d tokens (%.0f tokens), %.0f%% open with the same block",
		s.Records, s.Span.Seconds(), s.MeanInput, s.MaxInput, s.MeanOutput, s.DistinctIDs, blockTokens,
		float64(s.DistinctIDs)*float64(blockTokens), 100*s.SharedFirst)
}
