package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// Reading the usage engines report, as answers pass.
//
// vLLM, like OpenAI, ends an answer with a top-level "usage" object:
//
//	"usage":{"prompt_tokens":P,"total_tokens":T,"completion_tokens":C,
//	         "prompt_tokens_details":{"cached_tokens":K}}
//
// The Responses API (/v1/responses) names the same figures input_tokens
// and input_tokens_details.cached_tokens, in a top-level "usage" of a
// complete answer and, streamed, in the "response" object of its
// response.completed event: both are read.
//
// K is the prompt tokens whose KV blocks the engine found in its prefix
// cache, so summed per backend K/P is the KV hit rate users' requests saw.
// A complete (not streamed) answer carries it in its JSON body; a stream
// carries it in its last event, before "data: [DONE]", when the client
// asked for stream_options.include_usage (with continuous usage stats,
// every event carries one: the last counts). vLLM writes
// prompt_tokens_details only when it runs with
// --enable-prompt-tokens-details and K > 0: an answer without it counts 0
// cached tokens.
//
// usageScan reads the bytes where they already are, holding none of them:
// a complete body in place, a stream read by read with about a hundred
// bytes of state. A read of an event stream costs one bytes.Index for
// `usage"`; only a line that has it, or a line cut between two reads, is
// parsed. A complete answer is parsed when it has `usage"`; a JSON answer
// that is streamed (/invocations) is parsed as it passes. The values come
// from a backend and are checked: plain non-negative integers of at most
// maxUsageDigits digits, cached <= prompt; a report that breaks a rule
// counts as invalid, and nothing else of it.

// maxUsageDigits bounds a token count: under 10^9, far above any context
// length, so a hostile backend cannot push a counter far per answer.
const maxUsageDigits = 9

// maxUsageDepth bounds the JSON nesting followed; deeper, the scan stops.
const maxUsageDepth = 512

// usageResult is what an answer's usage said.
type usageResult uint8

const (
	usageNone      usageResult = iota // no top-level usage object
	usageOK                           // prompt_tokens and cached_tokens
	usageNoDetails                    // prompt_tokens without prompt_tokens_details.cached_tokens
	usageInvalid                      // a count missing, malformed or out of bounds, or cached > prompt
	numUsageResults
)

// usageResultNames are the result label values (usageNone is not counted).
var usageResultNames = [numUsageResults]string{"", "ok", "no_details", "invalid"}

// usageReport is one usage object, checked.
type usageReport struct {
	result         usageResult
	prompt, cached int64
}

var (
	// strUsageTail finds the key "usage" (one byte more than `"usage"`
	// would, but a quote, which JSON is full of, is a poor first byte to
	// look for).
	strUsageTail = []byte(`usage"`)
	strJSON      = []byte("application/json")
)

// countBodyUsage counts the usage in the complete answer resp from b,
// to a request predicted pr (predict.go).
func (b *backend) countBodyUsage(resp *fasthttp.Response, pr prediction) {
	var s usageScan
	s.begin(&resp.Header)
	if s.mode != scanOff {
		if body := resp.Body(); bytes.Contains(body, strUsageTail) {
			s.feed(body)
		}
	}
	b.countUsage(pr, s.report())
}

// Scan modes.
const (
	scanOff  uint8 = iota // neither JSON nor SSE, or not a 2xx answer
	scanJSON              // one JSON document
	scanSSE               // Server-Sent Events, a JSON document per data line
)

// SSE line states: 0-4 are the bytes of "data:" matched at the start of
// a line (0 at its start), then lineData or lineSkip.
const (
	lineData = uint8(len("data:"))
	lineSkip = lineData + 1
)

// usageScan finds the last top-level usage object of an answer (JSON) or
// of the events of a stream (SSE), fed in pieces. The zero value scans
// nothing; begin sets it up for an answer.
type usageScan struct {
	mode uint8
	line uint8 // SSE: where the current line stands
	j    usageJSON
}

// begin readies s for an answer with header h: JSON and SSE answers with
// a 2xx status are scanned.
func (s *usageScan) begin(h *fasthttp.ResponseHeader) {
	*s = usageScan{}
	if sc := h.StatusCode(); sc < 200 || sc > 299 {
		return
	}
	switch ct := h.ContentType(); {
	case bytes.HasPrefix(ct, strEventStream):
		s.mode = scanSSE
	case bytes.HasPrefix(ct, strJSON):
		s.mode = scanJSON
	}
}

// feed scans the next piece of the answer.
func (s *usageScan) feed(p []byte) {
	switch s.mode {
	case scanJSON:
		if s.j.state != jsDone {
			s.j.feed(p)
		}
	case scanSSE:
		s.feedSSE(p)
	}
}

// report returns the last usage object found.
func (s *usageScan) report() usageReport { return s.j.rep }

// feedSSE scans a piece of an event stream. Lines end at '\n' (a '\r'
// before it is whitespace to JSON). A line read whole is parsed only if
// it has `usage"`; a line cut at the end of p is parsed as it comes, as
// its rest may have the key.
func (s *usageScan) feedSSE(p []byte) {
	for len(p) > 0 {
		if s.line != 0 {
			// The rest of a line begun in an earlier piece.
			e := bytes.IndexByte(p, '\n')
			if e < 0 {
				s.lineBytes(p)
				return
			}
			s.lineBytes(p[:e])
			s.line = 0
			p = p[e+1:]
			continue
		}
		h := bytes.Index(p, strUsageTail)
		if h < 0 {
			// No whole line here has the key; a line left unfinished may.
			s.lineBytes(p[bytes.LastIndexByte(p, '\n')+1:])
			return
		}
		// Skip the whole lines before the one with the key.
		e := bytes.IndexByte(p, '\n')
		for e >= 0 && e < h {
			p, h = p[e+1:], h-e-1
			e = bytes.IndexByte(p, '\n')
		}
		if e < 0 {
			s.lineBytes(p)
			return
		}
		s.lineBytes(p[:e])
		s.line = 0
		p = p[e+1:]
	}
}

// lineBytes takes the next bytes of the current line: a "data:" field's
// value is a JSON document; other fields and comments are skipped.
func (s *usageScan) lineBytes(seg []byte) {
	for s.line < lineData && len(seg) > 0 {
		if seg[0] != "data:"[s.line] {
			s.line = lineSkip
			return
		}
		s.line++
		seg = seg[1:]
		if s.line == lineData {
			s.j.reset()
		}
	}
	if s.line == lineData && len(seg) > 0 && s.j.state != jsDone {
		s.j.feed(seg)
	}
}

// JSON scanner states, outside strings.
const (
	jsBefore uint8 = iota // before the document's '{'
	jsKey                 // in an object on the usage path: a key or '}'
	jsColon               // after a key
	jsValue               // after ':'
	jsNext                // after a value: ',' or '}'
	jsScalar              // in a number or literal on the usage path
	jsNested              // in a container off the usage path
	jsDone                // the document ended, or is not one to read
)

// Strings.
const (
	strNone uint8 = iota
	strSkip       // a value, or anything off the usage path
	strKey        // a key on the usage path, kept in kbuf
)

// Keys on the usage path.
const (
	keyOther    uint8 = iota
	keyUsage          // "usage" in the top-level object
	keyPrompt         // "prompt_tokens" in usage
	keyDetails        // "prompt_tokens_details" in usage
	keyCached         // "cached_tokens" in prompt_tokens_details
	keyResponse       // "response" in the top-level object (Responses API events)
)

// usageJSON follows one JSON document fed in pieces, far enough to read
// usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens of its
// top-level object (or of its "response" object, and under the Responses
// API's names). It keeps the objects on that path (on: 1 the top level, 2
// usage, 3 prompt_tokens_details; one more when the path goes through
// "response", which wrap notes) and only counts the depth of anything
// else. String contents are skipped with bytes.IndexByte. Keys
// written with escapes are not recognised. It stops at the first byte
// that cannot continue a JSON document, keeping what it found.
type usageJSON struct {
	state uint8
	str   uint8 // the string being read
	esc   bool  // the string's last byte so far is an escaping backslash
	on    uint8 // objects open on the usage path
	wrap  uint8 // 1 when the path goes through a top-level "response" object
	depth int32 // containers open
	key   uint8 // the key whose value comes next, on the path
	kesc  bool  // the key has an escape
	kn    int   // the key's length so far (kbuf holds it while it fits)
	kbuf  [len("prompt_tokens_details")]byte
	num   int64 // the count being read
	nd    uint8 // its digits
	nbad  bool  // it is not a plain integer of at most maxUsageDigits digits
	cur   usageAcc
	rep   usageReport // the last usage object completed
}

// usageAcc is the usage object being read.
type usageAcc struct {
	prompt, cached       int64
	hasPrompt, hasCached bool
	bad                  bool
}

// reset readies j for a new document, keeping the report.
func (j *usageJSON) reset() { *j = usageJSON{rep: j.rep} }

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// feed scans the next piece of the document.
func (j *usageJSON) feed(p []byte) {
	for i := 0; i < len(p); {
		if j.str != strNone {
			i = j.inString(p, i)
			continue
		}
		switch j.state {
		case jsDone:
			return
		case jsNested:
			i = j.nested(p, i)
			continue
		case jsScalar:
			i = j.scalar(p, i)
			continue
		}
		c := p[i]
		i++
		if isJSONSpace(c) {
			continue
		}
		switch j.state {
		case jsBefore:
			if c != '{' {
				j.state = jsDone
				continue
			}
			j.depth, j.on, j.state = 1, 1, jsKey
		case jsKey:
			switch c {
			case '"':
				j.str, j.kn, j.kesc = strKey, 0, false
			case '}':
				j.closeObject()
			default:
				j.state = jsDone
			}
		case jsColon:
			if c != ':' {
				j.state = jsDone
				continue
			}
			j.state = jsValue
		case jsValue:
			want := j.wantsCount()
			switch c {
			case '{':
				if !j.push() {
					continue
				}
				if j.on == 1 && j.wrap == 0 && j.key == keyResponse {
					j.on, j.wrap = 2, 1
					j.state = jsKey
					continue
				}
				if lvl := j.on - j.wrap; (lvl == 1 && j.key == keyUsage) || (lvl == 2 && j.key == keyDetails) {
					j.on++
					if lvl == 1 {
						j.cur = usageAcc{}
					}
					j.state = jsKey
					continue
				}
				j.cur.bad = j.cur.bad || want
				j.state = jsNested
			case '[':
				if !j.push() {
					continue
				}
				j.cur.bad = j.cur.bad || want
				j.state = jsNested
			case '"':
				j.cur.bad = j.cur.bad || want
				j.str, j.state = strSkip, jsNext
			default:
				j.state, j.num, j.nd, j.nbad = jsScalar, 0, 0, false
				i-- // the scalar's first byte
			}
		case jsNext:
			switch c {
			case ',':
				j.state = jsKey
			case '}':
				j.closeObject()
			default:
				j.state = jsDone
			}
		}
	}
}

// wantsCount reports whether the value about to be read is a count.
func (j *usageJSON) wantsCount() bool {
	lvl := j.on - j.wrap
	return (lvl == 2 && j.key == keyPrompt) || (lvl == 3 && j.key == keyCached)
}

// push opens a container; past maxUsageDepth the scan stops.
func (j *usageJSON) push() bool {
	j.depth++
	if j.depth > maxUsageDepth {
		j.state = jsDone
		return false
	}
	return true
}

// closeObject closes the object on the path the scan is in.
func (j *usageJSON) closeObject() {
	j.depth--
	j.on--
	switch {
	case j.on == 0:
		j.state = jsDone
		return
	case j.wrap == 1 && j.on == 1:
		j.wrap = 0 // the "response" object closed
	case j.on-j.wrap == 1:
		j.rep = j.cur.report()
	}
	j.state = jsNext
}

// report checks a usage object read whole.
func (u *usageAcc) report() usageReport {
	switch {
	case u.bad || !u.hasPrompt || (u.hasCached && u.cached > u.prompt):
		return usageReport{result: usageInvalid}
	case u.hasCached:
		return usageReport{result: usageOK, prompt: u.prompt, cached: u.cached}
	}
	return usageReport{result: usageNoDetails, prompt: u.prompt}
}

// nested skips through containers off the path, to the end of the one
// opened on it.
func (j *usageJSON) nested(p []byte, i int) int {
	for ; i < len(p); i++ {
		switch p[i] {
		case '"':
			j.str = strSkip
			return i + 1
		case '{', '[':
			if !j.push() {
				return len(p)
			}
		case '}', ']':
			j.depth--
			if j.depth == int32(j.on) {
				j.state = jsNext
				return i + 1
			}
		}
	}
	return i
}

// scalar reads a number or literal on the path, up to the byte after it.
func (j *usageJSON) scalar(p []byte, i int) int {
	want := j.wantsCount()
	for ; i < len(p); i++ {
		c := p[i]
		switch {
		case c == ',' || c == '}' || c == ']' || isJSONSpace(c):
			j.state = jsNext
			if want {
				j.endCount()
			}
			return i
		case !want:
		case '0' <= c && c <= '9' && j.nd < maxUsageDigits:
			if j.nd > 0 && j.num == 0 {
				j.nbad = true // a leading zero
			}
			j.num = j.num*10 + int64(c-'0')
			j.nd++
		default:
			j.nbad = true
		}
	}
	return i
}

// endCount stores the count just read into the usage object.
func (j *usageJSON) endCount() {
	if j.nbad || j.nd == 0 {
		j.cur.bad = true
		return
	}
	if j.key == keyPrompt {
		j.cur.prompt, j.cur.hasPrompt = j.num, true
	} else {
		j.cur.cached, j.cur.hasCached = j.num, true
	}
}

// inString reads string content from p[i:] and returns where to go on:
// after the closing quote, or len(p) when the string continues in the next
// piece. Short strings (keys, most values) are read a byte at a time;
// past shortString bytes, bytes.IndexByte finds the quotes.
func (j *usageJSON) inString(p []byte, i int) int {
	from := i
	for end := min(len(p), i+shortString); i < end; i++ {
		switch c := p[i]; {
		case j.esc:
			j.esc = false
		case c == '\\':
			j.esc = true
			j.kesc = j.kesc || j.str == strKey
		case c == '"':
			j.keyBytes(p[from:i])
			j.endString()
			return i + 1
		}
	}
	j.keyBytes(p[from:i])
	if i == len(p) {
		return i
	}
	if j.esc {
		j.esc = false
		i++ // the escaped byte
	}
	from = i
	for {
		q := bytes.IndexByte(p[i:], '"')
		if q < 0 {
			j.esc = oddBackslashes(p[from:])
			j.longKeyBytes(p[from:])
			return len(p)
		}
		q += i
		if oddBackslashes(p[from:q]) {
			i = q + 1 // an escaped quote
			continue
		}
		j.longKeyBytes(p[from:q])
		j.endString()
		return q + 1
	}
}

// shortString is how far a string is read a byte at a time.
const shortString = 24

// endString ends the string being read: a key on the path is named.
func (j *usageJSON) endString() {
	if j.str == strKey {
		j.key = keyOther
		if !j.kesc && j.kn <= len(j.kbuf) {
			j.key = usageKey(j.on-j.wrap, j.kbuf[:j.kn])
		}
		j.state = jsColon
	}
	j.str = strNone
}

// keyBytes adds b (whose backslashes were seen) to the key being read, if
// one is.
func (j *usageJSON) keyBytes(b []byte) {
	if j.str != strKey || len(b) == 0 {
		return
	}
	if j.kn+len(b) <= len(j.kbuf) {
		copy(j.kbuf[j.kn:], b)
		j.kn += len(b)
	} else {
		j.kn = len(j.kbuf) + 1
	}
}

// longKeyBytes is keyBytes for bytes not yet looked at.
func (j *usageJSON) longKeyBytes(b []byte) {
	if j.str == strKey && bytes.IndexByte(b, '\\') >= 0 {
		j.kesc = true
	}
	j.keyBytes(b)
}

// oddBackslashes reports whether b ends in an odd run of backslashes.
func oddBackslashes(b []byte) bool {
	n := 0
	for k := len(b) - 1; k >= 0 && b[k] == '\\'; k-- {
		n++
	}
	return n&1 == 1
}

// usageKey names key k of an object at level lvl of the usage path.
func usageKey(lvl uint8, k []byte) uint8 {
	switch lvl {
	case 1:
		switch string(k) {
		case "usage":
			return keyUsage
		case "response":
			return keyResponse
		}
	case 2:
		switch string(k) {
		case "prompt_tokens", "input_tokens":
			return keyPrompt
		case "prompt_tokens_details", "input_tokens_details":
			return keyDetails
		}
	case 3:
		if string(k) == "cached_tokens" {
			return keyCached
		}
	}
	return keyOther
}
