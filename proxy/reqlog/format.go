package reqlog

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/warmroute/warmroute/ring"
)

// The trace format's bounds and the recording's block size.
const (
	// BytesPerToken is the estimate of prompt text bytes per token, used
	// when the backend reported no usage, and the ratio between the
	// router's blocks and the trace's.
	BytesPerToken = 4
	// BlockTokens is the tokens per hash id of a recorded trace: the
	// router's blocks are ring.ChainBlockBytes (1 KiB) of canonical prompt
	// text, about 256 tokens. Replay a recording with
	// --trace-block-tokens 256.
	BlockTokens = ring.ChainBlockBytes / BytesPerToken
	// MaxHashIDs and MaxInputTokens keep a record within loadtest/trace's
	// default bounds (4,096 hash ids).
	MaxHashIDs     = 4096
	MaxInputTokens = MaxHashIDs * BlockTokens
	// MaxTotalHashIDs is loadtest/trace's default bound on a file's hash
	// ids: a recording stops there.
	MaxTotalHashIDs = 1 << 24
	// MaxOutputTokens is loadtest/trace's bound on output_length.
	MaxOutputTokens = 1 << 20
	// MaxTimestamp is loadtest/trace's bound on a timestamp: a recording
	// stops there.
	MaxTimestamp = 365 * 24 * time.Hour
)

// InputTokens is the record's input_length: the prompt tokens the backend
// reported, else an estimate from the prompt text (BytesPerToken), within
// [1, MaxInputTokens].
func (r *Record) InputTokens() int {
	n := r.PromptTokens
	if n <= 0 {
		text := r.TextBytes
		if text >= ring.MaxChainBlocks*ring.ChainBlockBytes && r.BodyBytes > text {
			text = r.BodyBytes // the text went on past the chain: the body is the better size
		}
		n = int64((text + BytesPerToken - 1) / BytesPerToken)
	}
	return int(min(max(n, 1), MaxInputTokens))
}

// HashIDs returns the number of hash ids of the record and the k-th one.
// There is one per full block of BlockTokens of the input: the prompt's
// chain keys while they last (53 bits of each, so any JSON reader keeps
// them exact; equal prefixes of equal model and tenant give equal ids),
// then ids derived from the key of all the text read, for prompts whose
// tokens run past the chain (text longer than ring.MaxChainBlocks blocks,
// or denser than BytesPerToken).
func (r *Record) HashIDs() int {
	in := r.InputTokens()
	full, need := in/BlockTokens, (in+BlockTokens-1)/BlockTokens
	return min(max(r.Blocks, full), need)
}

// HashID is the k-th hash id (k < HashIDs()).
func (r *Record) HashID(k int) int64 {
	if k < r.Blocks {
		return int64(r.Chain[k] >> 11)
	}
	return int64(splitmix(r.Tail+uint64(k)*0x9e3779b97f4a7c15) >> 11)
}

func splitmix(x uint64) uint64 {
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// AppendTrace appends r as a line of Mooncake's format, at ts from the
// start of the recording.
func AppendTrace(b []byte, r *Record, ts time.Duration) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendInt(b, int64(ts/time.Millisecond), 10)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(r.InputTokens()), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, min(max(r.CompletionTokens, 0), MaxOutputTokens), 10)
	b = append(b, `, "hash_ids": [`...)
	for k, n := 0, r.HashIDs(); k < n; k++ {
		if k > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, r.HashID(k), 10)
	}
	return append(b, "]}\n"...)
}

// TenantHash is the short hash of the tenant the access log shows (48
// bits of xxhash64, in hex), or "" without a tenant. It names a tenant
// without spelling it; a guessable tenant string can still be found by
// hashing guesses.
func (r *Record) TenantHash(dst []byte) []byte {
	if !r.hasTenant {
		return dst
	}
	const hexd = "0123456789abcdef"
	for s := 60; s >= 16; s -= 4 {
		dst = append(dst, hexd[(r.tenant>>s)&0xf])
	}
	return dst
}

func (r *Record) modelBytes() []byte { return r.model[:r.modelLen] }

// appendJSON appends r's access log line as one JSON object.
func appendJSON(b []byte, r *Record) []byte {
	b = append(b, `{"time":"`...)
	b = r.Start.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, `","route":`...)
	b = appendJSONString(b, []byte(r.Route))
	b = append(b, `,"model":`...)
	b = appendJSONString(b, r.modelBytes())
	b = append(b, `,"tenant":"`...)
	b = r.TenantHash(b)
	b = append(b, `","backend":`...)
	b = appendJSONString(b, []byte(r.Backend))
	b = append(b, `,"decision":`...)
	b = appendJSONString(b, []byte(r.Decision))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, r.BytesIn, 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, r.BytesOut, 10)
	b = append(b, `,"ttfb_ms":`...)
	b = appendMillis(b, r.TTFB, "null")
	b = append(b, `,"duration_ms":`...)
	b = appendMillis(b, r.Duration, "null")
	return append(b, "}\n"...)
}

// appendText appends r's access log line as logfmt key=value pairs.
func appendText(b []byte, r *Record) []byte {
	b = append(b, "time="...)
	b = r.Start.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, " route="...)
	b = appendTextValue(b, []byte(r.Route))
	b = append(b, " model="...)
	b = appendTextValue(b, r.modelBytes())
	b = append(b, " tenant="...)
	b = r.TenantHash(b)
	b = append(b, " backend="...)
	b = appendTextValue(b, []byte(r.Backend))
	b = append(b, " decision="...)
	b = appendTextValue(b, []byte(r.Decision))
	b = append(b, " status="...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, " bytes_in="...)
	b = strconv.AppendInt(b, r.BytesIn, 10)
	b = append(b, " bytes_out="...)
	b = strconv.AppendInt(b, r.BytesOut, 10)
	b = append(b, " ttfb_ms="...)
	b = appendMillis(b, r.TTFB, "-")
	b = append(b, " duration_ms="...)
	b = appendMillis(b, r.Duration, "-")
	return append(b, '\n')
}

func appendMillis(b []byte, d time.Duration, none string) []byte {
	if d < 0 {
		return append(b, none...)
	}
	return strconv.AppendFloat(b, float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b, s []byte) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// appendTextValue appends s bare when it is a plain token, else quoted;
// "" is written as "".
func appendTextValue(b, s []byte) []byte {
	plain := len(s) > 0
	for _, c := range s {
		if c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return append(b, s...)
	}
	return appendJSONString(b, s)
}
