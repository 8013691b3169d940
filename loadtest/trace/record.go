package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// Defaults of ParseConfig.
const (
	// DefaultBlockTokens is the tokens per hash id of Mooncake's traces.
	DefaultBlockTokens = 512
	// DefaultMaxLineBytes bounds one line (a record of 4,096 hash ids is
	// under 40 KB).
	DefaultMaxLineBytes = 1 << 20
	// DefaultMaxHashIDs bounds one record's hash_ids: 4,096 blocks are
	// 2 M tokens at 512 per block, far beyond any context length.
	DefaultMaxHashIDs = 4096
	// DefaultMaxRecords bounds the records of a file (Mooncake's traces
	// have 12,000 to 24,000).
	DefaultMaxRecords = 1 << 20
	// DefaultMaxTotalHashIDs bounds the hash ids of a whole file (128 MB
	// of them).
	DefaultMaxTotalHashIDs = 1 << 24
)

// Other bounds on a record's values.
const (
	maxTimestamp    = 365 * 24 * time.Hour
	maxOutputLength = 1 << 20
)

// Errors. Parse wraps them in a *LineError.
var (
	// ErrBadRecord is a line that is not a valid record.
	ErrBadRecord = errors.New("trace: invalid record")
	// ErrTooLarge is a line, record or file over a ParseConfig limit.
	ErrTooLarge = errors.New("trace: over a limit")
	// ErrBadConfig wraps an invalid ParseConfig, ReplayConfig or
	// GenConfig.
	ErrBadConfig = errors.New("trace: invalid config")
)

// LineError is an error at one line of a trace file.
type LineError struct {
	Line int // from 1
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("trace: line %d: %v", e.Line, e.Err) }

// Unwrap returns the underlying error.
func (e *LineError) Unwrap() error { return e.Err }

// Record is one request of a trace.
type Record struct {
	// Line is the record's line in its file (from 1), or its position in
	// a generated trace; a block without a hash id is named after it.
	Line int
	// Timestamp is the arrival, from the start of the trace.
	Timestamp time.Duration
	// InputLength and OutputLength are the prompt's and the answer's
	// lengths in tokens.
	InputLength, OutputLength int
	// HashIDs names each block of BlockTokens prompt tokens, the last one
	// possibly partial.
	HashIDs []int64
}

// ParseConfig bounds what Parse accepts. The zero value of a field means
// its default.
type ParseConfig struct {
	// BlockTokens is the tokens per hash id (default 512).
	BlockTokens int
	// MaxLineBytes, MaxHashIDs, MaxRecords and MaxTotalHashIDs bound a
	// line, a record's hash_ids, the records and all hash ids of the
	// file.
	MaxLineBytes, MaxHashIDs, MaxRecords, MaxTotalHashIDs int
}

// withDefaults fills the zero fields of c and checks the rest.
func (c ParseConfig) withDefaults() (ParseConfig, error) {
	def := func(v *int, d, hi int, name string) error {
		if *v == 0 {
			*v = d
		}
		if *v < 1 || *v > hi {
			return fmt.Errorf("%w: %s %d outside 1-%d", ErrBadConfig, name, *v, hi)
		}
		return nil
	}
	return c, errors.Join(
		def(&c.BlockTokens, DefaultBlockTokens, 1<<16, "block tokens"),
		def(&c.MaxLineBytes, DefaultMaxLineBytes, 1<<28, "max line bytes"),
		def(&c.MaxHashIDs, DefaultMaxHashIDs, 1<<20, "max hash ids"),
		def(&c.MaxRecords, DefaultMaxRecords, 1<<26, "max records"),
		def(&c.MaxTotalHashIDs, DefaultMaxTotalHashIDs, 1<<28, "max total hash ids"),
	)
}

// wireRecord is a line as decoded; absent fields stay nil.
type wireRecord struct {
	Timestamp    *float64        `json:"timestamp"`
	InputLength  *int64          `json:"input_length"`
	OutputLength *int64          `json:"output_length"`
	HashIDs      json.RawMessage `json:"hash_ids"`
}

// Parse reads a trace in Mooncake's JSONL format. Blank lines are skipped
// and unknown fields ignored; records need not be in time order (a Replay
// sorts them). Every record must have the four fields, a timestamp of 0 to
// 365 days in milliseconds (fractions allowed), an input_length of at
// least 1 token, an output_length of 0 or more, and one hash id per block
// of the input: ceil(input_length / BlockTokens) of them, or
// floor(input_length / BlockTokens) as some descriptions of the format
// state (the last, partial block then has no id and is never shared).
// The first invalid line ends the parse with a *LineError.
func Parse(r io.Reader, c ParseConfig) ([]Record, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, min(64<<10, c.MaxLineBytes)), c.MaxLineBytes)
	var (
		out     []Record
		scratch []int64
		total   int
		line    int
	)
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out) >= c.MaxRecords {
			return nil, &LineError{line, fmt.Errorf("%w: more than %d records", ErrTooLarge, c.MaxRecords)}
		}
		var rec Record
		rec, scratch, err = parseLine(b, &c, scratch)
		if err != nil {
			return nil, &LineError{line, err}
		}
		if total += len(rec.HashIDs); total > c.MaxTotalHashIDs {
			return nil, &LineError{line, fmt.Errorf("%w: more than %d hash ids in the file", ErrTooLarge, c.MaxTotalHashIDs)}
		}
		rec.Line = line
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{line + 1, fmt.Errorf("%w: line longer than %d bytes", ErrTooLarge, c.MaxLineBytes)}
		}
		return nil, fmt.Errorf("trace: after line %d: %w", line, err)
	}
	return out, nil
}

// parseLine decodes and checks one non-blank line, using scratch for the
// hash ids before copying them out.
func parseLine(b []byte, c *ParseConfig, scratch []int64) (Record, []int64, error) {
	var w wireRecord
	if err := json.Unmarshal(b, &w); err != nil {
		return Record{}, scratch, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	switch {
	case w.Timestamp == nil:
		return Record{}, scratch, fmt.Errorf("%w: no timestamp", ErrBadRecord)
	case w.InputLength == nil:
		return Record{}, scratch, fmt.Errorf("%w: no input_length", ErrBadRecord)
	case w.OutputLength == nil:
		return Record{}, scratch, fmt.Errorf("%w: no output_length", ErrBadRecord)
	case len(w.HashIDs) == 0 || string(w.HashIDs) == "null":
		return Record{}, scratch, fmt.Errorf("%w: no hash_ids", ErrBadRecord)
	}
	ts := *w.Timestamp
	if math.IsNaN(ts) || ts < 0 || ts > float64(maxTimestamp/time.Millisecond) {
		return Record{}, scratch, fmt.Errorf("%w: timestamp %v ms outside 0-%d", ErrBadRecord, ts, maxTimestamp/time.Millisecond)
	}
	ids, err := parseIDs(w.HashIDs, c.MaxHashIDs, scratch[:0])
	if err != nil {
		return Record{}, ids, err
	}
	if in, hi := *w.InputLength, int64(c.MaxHashIDs)*int64(c.BlockTokens); in < 1 || in > hi {
		return Record{}, ids, fmt.Errorf("%w: input_length %d outside 1-%d (%d hash ids of %d tokens)", ErrBadRecord, in, hi, c.MaxHashIDs, c.BlockTokens)
	}
	if out := *w.OutputLength; out < 0 || out > maxOutputLength {
		return Record{}, ids, fmt.Errorf("%w: output_length %d outside 0-%d", ErrBadRecord, out, maxOutputLength)
	}
	rec := Record{
		Timestamp:    time.Duration(ts * float64(time.Millisecond)),
		InputLength:  int(*w.InputLength),
		OutputLength: int(*w.OutputLength),
		HashIDs:      ids,
	}
	if err := checkRecord(&rec, c.BlockTokens, c.MaxHashIDs); err != nil {
		return Record{}, ids, err
	}
	rec.HashIDs = slices.Clone(ids)
	return rec, ids, nil
}

// checkRecord checks a record's lengths against its hash ids.
func checkRecord(r *Record, blockTokens, maxIDs int) error {
	maxInput := maxIDs * blockTokens
	switch {
	case r.Timestamp < 0 || r.Timestamp > maxTimestamp:
		return fmt.Errorf("%w: timestamp %v outside 0-%v", ErrBadRecord, r.Timestamp, maxTimestamp)
	case r.InputLength < 1 || r.InputLength > maxInput:
		return fmt.Errorf("%w: input_length %d outside 1-%d (%d hash ids of %d tokens)", ErrBadRecord, r.InputLength, maxInput, maxIDs, blockTokens)
	case r.OutputLength < 0 || r.OutputLength > maxOutputLength:
		return fmt.Errorf("%w: output_length %d outside 0-%d", ErrBadRecord, r.OutputLength, maxOutputLength)
	case len(r.HashIDs) > maxIDs:
		return fmt.Errorf("%w: %d hash ids, more than %d", ErrTooLarge, len(r.HashIDs), maxIDs)
	}
	full := r.InputLength / blockTokens
	need := (r.InputLength + blockTokens - 1) / blockTokens
	if n := len(r.HashIDs); n != need && n != full {
		return fmt.Errorf("%w: input_length %d needs %d hash ids of %d tokens, got %d", ErrBadRecord, r.InputLength, need, blockTokens, n)
	}
	for _, id := range r.HashIDs {
		if id < 0 {
			return fmt.Errorf("%w: negative hash id %d", ErrBadRecord, id)
		}
	}
	return nil
}

// parseIDs reads a JSON array of integers (already checked to be valid
// JSON) into dst, stopping at more than limit.
func parseIDs(raw []byte, limit int, dst []int64) ([]int64, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return dst, fmt.Errorf("%w: hash_ids is not an array", ErrBadRecord)
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return dst, nil
	}
	for {
		j := i
		for j < len(raw) && raw[j] != ',' && raw[j] != ']' && !isSpace(raw[j]) {
			j++
		}
		v, err := strconv.ParseInt(string(raw[i:j]), 10, 64)
		if err != nil {
			return dst, fmt.Errorf("%w: hash id %.40q is not an integer", ErrBadRecord, raw[i:j])
		}
		if len(dst) == limit {
			return dst, fmt.Errorf("%w: more than %d hash ids", ErrTooLarge, limit)
		}
		dst = append(dst, v)
		j = skipSpace(raw, j)
		if j >= len(raw) {
			return dst, fmt.Errorf("%w: unterminated hash_ids", ErrBadRecord)
		}
		if raw[j] == ']' {
			return dst, nil
		}
		i = skipSpace(raw, j+1) // past the comma
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// Write writes recs in Mooncake's format, one line each, timestamps in
// whole milliseconds.
func Write(w io.Writer, recs []Record) error {
	bw := bufio.NewWriter(w)
	var b []byte
	for i := range recs {
		r := &recs[i]
		b = append(b[:0], `{"timestamp": `...)
		b = strconv.AppendInt(b, int64(r.Timestamp/time.Millisecond), 10)
		b = append(b, `, "input_length": `...)
		b = strconv.AppendInt(b, int64(r.InputLength), 10)
		b = append(b, `, "output_length": `...)
		b = strconv.AppendInt(b, int64(r.OutputLength), 10)
		b = append(b, `, "hash_ids": [`...)
		for j, id := range r.HashIDs {
			if j > 0 {
				b = append(b, ", "...)
			}
			b = strconv.AppendInt(b, id, 10)
		}
		b = append(b, "]}\n"...)
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}
