package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// API is the kind of request body a key is read from.
type API uint8

const (
	// Chat is POST /v1/chat/completions: the prompt is the messages.
	Chat API = iota
	// Completions is POST /v1/completions: the prompt is `prompt`.
	Completions
	// Invocations is SageMaker's POST /invocations: the raw body, or with
	// KeyConfig.InvocationsJSON the first of messages, prompt and inputs.
	Invocations
	// Embeddings is POST /v1/embeddings: the prompt is `input`.
	Embeddings
	// Responses is POST /v1/responses: `tools`, `instructions` and `input`.
	Responses
	// Rerank is POST /v1/rerank (and /rerank, /v2/rerank): `query`.
	Rerank
	// Score is POST /v1/score (and /score): `text_1`.
	Score
	// Tokenize is POST /tokenize: `messages` (with `tools`) or `prompt`.
	Tokenize
	// Detokenize is POST /detokenize: the token ids of `tokens`.
	Detokenize
	numAPIs
)

var apiNames = [numAPIs]string{"chat", "completions", "invocations", "embeddings", "responses", "rerank", "score", "tokenize", "detokenize"}

func (a API) String() string {
	if a < numAPIs {
		return apiNames[a]
	}
	return "unknown"
}

// MaxTenantLength is the longest prefix-aware id accepted (SageMaker's).
const MaxTenantLength = 64

// KeyInfo is what Extract learned from a request.
type KeyInfo struct {
	// Key is the routing key.
	Key uint64
	// PrefixBytes is how many bytes of prompt text went into the key.
	PrefixBytes int
	// Model is the raw `model` string as sent (escapes undecoded); it
	// aliases the body. Empty when absent.
	Model []byte
	// Tenant is the tenant as sent: the header value, or the raw
	// `prompt_cache_key` string. It aliases its source.
	Tenant []byte
	// TenantFromHeader says where Tenant came from.
	TenantFromHeader bool
	// Stream is the body's `stream` flag.
	Stream bool

	// The block chain, read only when KeyConfig.ChainBlocks > 0: Chain[k]
	// is the digest of the first (k+1) x ChainBlockBytes bytes of prompt
	// text, for the Blocks full blocks read; Tail is the digest of all the
	// text read (the full blocks and what follows them, up to
	// ChainBlocks x ChainBlockBytes bytes). KeyAt turns them into keys.
	Chain  [MaxChainBlocks]uint64
	Blocks int
	Tail   uint64
	// Session says the key comes from a session id (UseSession), not from
	// the prompt.
	Session bool

	// scope holds the digests of the model and the tenant, which every key
	// mixes in; seed is their digest, for KeyAt.
	scope [2]uint64
	seed  uint64
	chain bool // read with ChainBlocks > 0
}

// NewSession is the session id SageMaker clients send to open a session:
// it names none yet, so it keys nothing.
const NewSession = "NEW_SESSION"

// MaxSessionLength is the longest session id accepted.
const MaxSessionLength = 256

// CheckSession validates a session id: 1-MaxSessionLength printable ASCII
// characters.
func CheckSession(v []byte) error { return checkHeaderValue(v, MaxSessionLength, ErrBadSession) }

// UseSession keys the request on session id v (checked by CheckSession)
// under its model and tenant, instead of on its prompt text: every request
// of the session gets one key, whatever its prompt, and no prefix is
// counted towards splits. Call it after Extract.
func (k *KeyInfo) UseSession(v []byte) {
	d := xxhash.Sum64(v)
	k.Session, k.PrefixBytes, k.Blocks, k.Tail = true, 0, 0, d
	if k.chain {
		k.Key = k.KeyAt(0)
		return
	}
	k.Key = mixKey(k.scope, d)
}

// ChainBlockBytes is the size of a block of the prompt's block chain:
// adaptive keys route on a whole number of blocks of prompt text.
const ChainBlockBytes = 1024

// MaxChainBlocks is the longest chain read: MaxPrefixLength bytes.
const MaxChainBlocks = MaxPrefixLength / ChainBlockBytes

// KeyAt returns the key of the first depth+1 blocks of the chain, or for
// depth == Blocks (or beyond) the key of all the text read. Like Key, it
// mixes in the model and the tenant, so two tenants never share a key.
func (k *KeyInfo) KeyAt(depth int) uint64 {
	p := k.Tail
	if depth < k.Blocks {
		p = k.Chain[depth]
	}
	return fmix64(k.seed ^ p)
}

// fmix64 is MurmurHash3's 64-bit finalizer: a bijection that spreads every
// input bit over the output. KeyAt is called for every block a request
// reads, so it is a few multiplications, not a hash of 24 bytes.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// mixKey is the key of prompt digest p under scope (model and tenant).
func mixKey(scope [2]uint64, p uint64) uint64 {
	var sum [24]byte
	binary.LittleEndian.PutUint64(sum[0:], scope[0])
	binary.LittleEndian.PutUint64(sum[8:], scope[1])
	binary.LittleEndian.PutUint64(sum[16:], p)
	return xxhash.Sum64(sum[:])
}

// CheckTenant validates an X-Amzn-SageMaker-Prefix-Aware-Id value: 1-64
// printable ASCII characters.
func CheckTenant(v []byte) error { return checkHeaderValue(v, MaxTenantLength, ErrBadTenant) }

// checkHeaderValue checks that v is 1-max printable ASCII characters; its
// errors wrap bad.
func checkHeaderValue(v []byte, max int, bad error) error {
	if len(v) == 0 || len(v) > max {
		return fmt.Errorf("%w: want 1-%d printable characters, got %d bytes", bad, max, len(v))
	}
	for _, c := range v {
		if c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: non-printable character 0x%02x", bad, c)
		}
	}
	return nil
}

// Extract reads the routing key of a request body. tenantHeader is the
// X-Amzn-SageMaker-Prefix-Aware-Id header: nil when absent (a present but
// empty header is an error). It never allocates on success and never panics;
// errors wrap ErrMalformedJSON, ErrInvalidRequest, ErrTooDeep or
// ErrBadTenant.
//
// The key is xxhash64 over three 64-bit digests: of the model, of the
// tenant and of the first PrefixLength bytes of prompt text (cut back to a
// UTF-8 boundary). Prompt text is what the engine's cache sees, in the
// order it sees it:
//   - chat: when the body has `tools` (or the older `functions`), "\x00tools\n"
//     and their JSON without insignificant white space, as chat templates
//     put them ahead of the conversation; then for each message in order,
//     its role, '\n', its content (text parts of a content array joined by
//     '\n'; any other part, such as an image_url or input_audio, as "\x00",
//     its type, '\n' and its payload's JSON without white space, so two
//     images make two keys) and '\n';
//   - completions: the prompt string; the first string of a prompt array;
//     token ids as decimal text each followed by ' ';
//   - embeddings: `input` like completions' prompt; score: `text_1` the
//     same way; rerank: the `query` string; detokenize: the `tokens` ids;
//     tokenize: `messages` like chat, else `prompt` like completions;
//   - responses: tools as for chat, then "system\n" and `instructions`
//     and '\n', then `input`: a string as "user\n", the text and '\n', or
//     for each item of an array, a message's role, '\n', content and
//     '\n' as for chat (input_text and output_text parts are text), any
//     other item (a function call or its output) as "\x00" and its JSON
//     without white space;
//   - invocations: the raw body, or as above with InvocationsJSON (TGI's
//     `inputs` string too).
//
// A body without tools or non-text parts gives the text, and the key, it
// gave before these were read.
//
// With cfg.ChainBlocks > 0 it reads the block chain instead (see KeyInfo's
// Chain, Blocks and Tail) and Key is KeyAt(0); Splits.Route picks the key
// to route on.
//
// JSON strings are unescaped before hashing, so "\u00e9" and "é" agree.
func Extract(cfg KeyConfig, api API, body, tenantHeader []byte, info *KeyInfo) error {
	*info = KeyInfo{}
	if tenantHeader != nil {
		if err := CheckTenant(tenantHeader); err != nil {
			return err
		}
		info.Tenant, info.TenantFromHeader = tenantHeader, true
	}
	pw := prefixWriter{fixed: cfg.PrefixLength}
	if pw.fixed <= 0 {
		pw.fixed = MaxPrefixLength
	}
	if cfg.ChainBlocks > 0 {
		pw.info, pw.limit, pw.fixed = info, min(cfg.ChainBlocks, MaxChainBlocks)*ChainBlockBytes, 0
	} else {
		pw.limit = pw.fixed
	}
	pw.d.Reset()
	if api == Invocations && !cfg.InvocationsJSON {
		pw.raw(body)
	} else if err := extractJSON(api, body, info, &pw); err != nil {
		return err
	}
	var md, td xxhash.Digest
	md.Reset()
	td.Reset()
	if err := writeString(&md, info.Model); err != nil {
		return err
	}
	if info.TenantFromHeader {
		td.Write(info.Tenant)
	} else if err := writeString(&td, info.Tenant); err != nil {
		return err
	}
	info.scope = [2]uint64{md.Sum64(), td.Sum64()}
	if cfg.ChainBlocks > 0 {
		info.seed, info.chain = mixKey(info.scope, 0), true
		info.PrefixBytes = pw.written
		info.Tail = pw.d.Sum64()
		info.Key = info.KeyAt(0)
		return nil
	}
	info.PrefixBytes = pw.fixedBytes
	if !pw.fixedDone {
		pw.fixedSum, pw.fixedBytes = pw.d.Sum64(), pw.written
		info.PrefixBytes = pw.written
	}
	info.Key = mixKey(info.scope, pw.fixedSum)
	return nil
}

// bodyFields are the raw spans of the top-level fields Extract cares about.
type bodyFields struct {
	messages, prompt, inputs, tools []byte
	input, instructions, query      []byte
	text1, tokens                   []byte
}

// chatAPI reports whether api's body may be a chat conversation read
// inline (in the one pass over the body).
func chatAPI(api API) bool { return api == Chat || api == Tokenize }

// extractJSON writes the prompt text of a JSON body and notes its model,
// tenant and stream flag: one walk over the top-level object, then the
// prompt fields of the APIs the walk did not read.
func extractJSON(api API, body []byte, info *KeyInfo, pw *prefixWriter) error {
	r := bodyReader{api: api, s: scanner{b: body}}
	if err := r.walk(info, pw); err != nil {
		return err
	}
	return keptPrefix(api, &r.f, pw)
}

// bodyReader is the one walk over a body's top-level object. Chat and
// completions hash their prompt field during the walk; a repeated field
// starts over, so the last one counts, as in every JSON decoder engines
// use. Tools come first in the prompt text: tools after the messages
// start the messages over from their span. The other APIs keep the spans
// of their fields in f and pick among them after the walk.
//
// The KeyInfo and the prefixWriter are passed to its methods, not kept in
// it: escape analysis does not tell a struct's fields apart, so a struct
// holding both spans of the body and a pointer to Extract's prefixWriter
// would move the writer to the heap.
type bodyReader struct {
	api API
	s   scanner
	f   bodyFields
}

// walk consumes the body, which must be one JSON object and nothing more.
// Chat's messages and completions' prompt are hashed as they are read; any
// other member's value is read whole and noted.
func (r *bodyReader) walk(info *KeyInfo, pw *prefixWriter) error {
	if c := r.s.peek(); c != '{' {
		if c == 0 {
			return fmt.Errorf("%w: empty body", ErrMalformedJSON)
		}
		if _, err := r.s.value(); err != nil {
			return err
		}
		return fmt.Errorf("%w: body must be a JSON object", ErrInvalidRequest)
	}
	err := r.s.object(func(key []byte) error {
		switch string(key) {
		case "messages":
			if chatAPI(r.api) {
				return r.messages(pw)
			}
		case "prompt":
			if r.api == Completions {
				pw.reset()
				r.f.prompt = key // present; its text is written now
				return promptPrefix(&r.s, pw)
			}
		}
		kind, raw, err := r.s.span()
		if err != nil {
			return err
		}
		return r.note(key, kind, raw, info, pw)
	})
	if err != nil {
		return err
	}
	return r.s.end()
}

// messages writes the messages array at the cursor after the tools seen
// so far, and keeps its span for tools that come after it.
func (r *bodyReader) messages(pw *prefixWriter) error {
	r.s.ws()
	from := r.s.i
	err := chatText(r.f.tools, &r.s, pw)
	r.f.messages = r.s.b[from:r.s.i]
	return err
}

// note keeps what a member read whole says: the model, the tenant, the
// stream flag, the tools, or the span of a prompt field.
func (r *bodyReader) note(key []byte, kind byte, raw []byte, info *KeyInfo, pw *prefixWriter) error {
	switch string(key) {
	case "model":
		if kind != '"' {
			return fmt.Errorf("%w: model must be a string", ErrInvalidRequest)
		}
		info.Model = raw[1 : len(raw)-1]
	case "prompt_cache_key":
		switch kind {
		case '"':
			if !info.TenantFromHeader {
				info.Tenant = raw[1 : len(raw)-1]
			}
		case 'z':
		default:
			return fmt.Errorf("%w: prompt_cache_key must be a string", ErrInvalidRequest)
		}
	case "stream":
		info.Stream = kind == 't'
	case "tools", "functions":
		return r.tools(key, kind, raw, pw)
	case "messages":
		r.f.messages = raw
	case "prompt":
		r.f.prompt = raw
	case "inputs":
		r.f.inputs = raw
	case "input":
		r.f.input = raw
	case "instructions":
		r.f.instructions = raw
	case "query":
		r.f.query = raw
	case "text_1":
		r.f.text1 = raw
	case "tokens":
		r.f.tokens = raw
	}
	return nil
}

// tools keeps a tools (or functions) array, null or [] being none. They
// lead a conversation's text, so messages already written are written
// over after them.
func (r *bodyReader) tools(key []byte, kind byte, raw []byte, pw *prefixWriter) error {
	if kind != '[' && kind != 'z' {
		return fmt.Errorf("%w: %s must be an array", ErrInvalidRequest, key)
	}
	if kind == 'z' || raw[1+bytes.IndexFunc(raw[1:], notSpace)] == ']' {
		raw = nil // null or []: no tools
	}
	r.f.tools = raw
	if chatAPI(r.api) && r.f.messages != nil {
		sub := scanner{b: r.f.messages}
		return chatText(r.f.tools, &sub, pw)
	}
	return nil
}

// chatText writes a conversation's prompt text from the start: its tools
// (nil: none), then the messages array at s's cursor.
func chatText(tools []byte, s *scanner, pw *prefixWriter) error {
	pw.reset()
	if err := writeTools(tools, pw); err != nil {
		return err
	}
	return chatPrefix(s, pw)
}

// keptPrefix writes the prompt text of the APIs the walk did not read,
// from the spans it kept, and checks that chat and completions had their
// prompt field.
func keptPrefix(api API, f *bodyFields, pw *prefixWriter) error {
	switch api {
	case Chat:
		if f.messages == nil {
			return fmt.Errorf("%w: messages is required", ErrInvalidRequest)
		}
		return nil
	case Completions:
		if f.prompt == nil {
			return fmt.Errorf("%w: prompt is required", ErrInvalidRequest)
		}
		return nil
	case Embeddings:
		return promptField(f.input, "input", pw)
	case Score:
		return promptField(f.text1, "text_1", pw)
	case Rerank:
		return rerankPrefix(f.query, pw)
	case Detokenize:
		return detokenizePrefix(f.tokens, pw)
	case Tokenize:
		return tokenizePrefix(f, pw)
	case Responses:
		return responsesPrefix(f, pw)
	}
	return invocationsPrefix(f, pw)
}

// rerankPrefix writes a rerank request's query string.
func rerankPrefix(query []byte, pw *prefixWriter) error {
	if query == nil {
		return fmt.Errorf("%w: query is required", ErrInvalidRequest)
	}
	if query[0] != '"' {
		return fmt.Errorf("%w: query must be a string", ErrInvalidRequest)
	}
	return pw.json(query[1 : len(query)-1])
}

// detokenizePrefix writes a detokenize request's token ids.
func detokenizePrefix(tokens []byte, pw *prefixWriter) error {
	if tokens == nil {
		return fmt.Errorf("%w: tokens is required", ErrInvalidRequest)
	}
	if tokens[0] != '[' {
		return fmt.Errorf("%w: tokens must be an array of token ids", ErrInvalidRequest)
	}
	return tokenIDs(tokens, pw)
}

// tokenizePrefix writes a tokenize request's prompt, unless its messages
// were written during the walk.
func tokenizePrefix(f *bodyFields, pw *prefixWriter) error {
	switch {
	case f.messages != nil:
		return nil // written during the walk
	case f.prompt != nil:
		sub := scanner{b: f.prompt}
		return promptPrefix(&sub, pw)
	}
	return fmt.Errorf("%w: prompt or messages is required", ErrInvalidRequest)
}

// invocationsPrefix writes a JSON invocations body's prompt text from the
// first of its messages (as chat's), prompt (as completions') and inputs
// (TGI's string).
func invocationsPrefix(f *bodyFields, pw *prefixWriter) error {
	switch {
	case f.messages != nil:
		sub := scanner{b: f.messages}
		return chatText(f.tools, &sub, pw)
	case f.prompt != nil:
		sub := scanner{b: f.prompt}
		return promptPrefix(&sub, pw)
	case f.inputs != nil:
		if f.inputs[0] != '"' {
			return fmt.Errorf("%w: inputs must be a string", ErrInvalidRequest)
		}
		return pw.json(f.inputs[1 : len(f.inputs)-1])
	}
	return fmt.Errorf("%w: body has none of messages, prompt or inputs", ErrInvalidRequest)
}

func notSpace(r rune) bool { return !isSpace(byte(r)) || r > 0x7f }

// promptField writes the field raw named name like completions' prompt,
// or says it is missing.
func promptField(raw []byte, name string, pw *prefixWriter) error {
	if raw == nil {
		return fmt.Errorf("%w: %s is required", ErrInvalidRequest, name)
	}
	sub := scanner{b: raw}
	if err := promptPrefix(&sub, pw); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

var (
	toolsMarker = []byte("\x00tools\n")
	partMarker  = []byte("\x00")
	systemRole  = []byte("system")
	userRole    = []byte("user")
)

// writeTools writes a tools array (nil: none) as the prompt text's head.
func writeTools(raw []byte, pw *prefixWriter) error {
	if raw == nil {
		return nil
	}
	pw.raw(toolsMarker)
	compactJSON(raw, pw)
	pw.raw(newline)
	return nil
}

// compactJSON writes the raw JSON value v without the white space outside
// its strings (v was checked by the scanner).
func compactJSON(v []byte, pw *prefixWriter) {
	from, inStr := 0, false
	for i := 0; i < len(v) && !pw.full(); i++ {
		c := v[i]
		switch {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case !inStr && isSpace(c):
			pw.raw(v[from:i])
			from = i + 1
		}
	}
	if from < len(v) {
		pw.raw(v[from:])
	}
}

// responsesPrefix writes a Responses API request's prompt text: tools,
// instructions, then input: a string, or an array of items.
func responsesPrefix(f *bodyFields, pw *prefixWriter) error {
	if f.input == nil {
		return fmt.Errorf("%w: input is required", ErrInvalidRequest)
	}
	if err := writeTools(f.tools, pw); err != nil {
		return err
	}
	if f.instructions != nil && f.instructions[0] != 'n' {
		if f.instructions[0] != '"' {
			return fmt.Errorf("%w: instructions must be a string", ErrInvalidRequest)
		}
		if err := writeTurn(systemRole, f.instructions, pw); err != nil {
			return err
		}
	}
	switch f.input[0] {
	case '"':
		return writeTurn(userRole, f.input, pw)
	case '[':
	default:
		return fmt.Errorf("%w: input must be a string or an array of items", ErrInvalidRequest)
	}
	s := scanner{b: f.input}
	return s.array(func(i int) error { return responsesItem(&s, i, pw) })
}

// writeTurn writes role, '\n', the text of text (a raw JSON string, quotes
// included) and '\n'.
func writeTurn(role, text []byte, pw *prefixWriter) error {
	pw.raw(role)
	pw.raw(newline)
	if err := pw.json(text[1 : len(text)-1]); err != nil {
		return err
	}
	pw.raw(newline)
	return nil
}

// responsesItem consumes the item of a Responses input array at the
// cursor and writes it: a message (an item with a role) as writeMessage
// does, any other item (a function call, its output, reasoning) as the
// engine gets it: "\x00", its JSON without white space and '\n'.
func responsesItem(s *scanner, i int, pw *prefixWriter) error {
	if s.peek() != '{' {
		return fmt.Errorf("%w: input[%d] must be an object", ErrInvalidRequest, i)
	}
	_, item, err := s.span()
	if err != nil {
		return err
	}
	var role, content []byte
	var contentKind byte
	sub := scanner{b: item}
	err = sub.object(func(key []byte) error {
		kind, v, err := sub.span()
		if err != nil {
			return err
		}
		switch {
		case bytes.Equal(key, keyRole):
			if kind != '"' {
				return fmt.Errorf("%w: input[%d].role must be a string", ErrInvalidRequest, i)
			}
			role = v[1 : len(v)-1]
		case bytes.Equal(key, keyContent):
			content, contentKind = v, kind
		}
		return nil
	})
	if err != nil {
		return err
	}
	if role == nil {
		pw.raw(partMarker)
		compactJSON(item, pw)
		pw.raw(newline)
		return nil
	}
	return writeMessage(role, content, contentKind, "input", i, pw)
}

var (
	keyRole    = []byte("role")
	keyContent = []byte("content")
	keyType    = []byte("type")
	keyText    = []byte("text")
	// The Responses API's text parts.
	keyInputText  = []byte("input_text")
	keyOutputText = []byte("output_text")
	newline       = []byte("\n")
	space         = []byte(" ")
)

// chatPrefix consumes the messages array at the cursor, checking its shape
// and writing its text.
func chatPrefix(s *scanner, pw *prefixWriter) error {
	if c := s.peek(); c != '[' {
		if _, err := s.value(); err != nil {
			return err
		}
		return fmt.Errorf("%w: messages must be an array", ErrInvalidRequest)
	}
	count := 0
	err := s.array(func(i int) error {
		count++
		return chatMessage(s, i, pw)
	})
	if err != nil {
		return err
	}
	if count == 0 {
		return fmt.Errorf("%w: messages must not be empty", ErrInvalidRequest)
	}
	return nil
}

// chatMessage consumes message i of a messages array at the cursor,
// checking its shape, and writes it.
func chatMessage(s *scanner, i int, pw *prefixWriter) error {
	if s.peek() != '{' {
		return fmt.Errorf("%w: messages[%d] must be an object", ErrInvalidRequest, i)
	}
	var role, content []byte
	var contentKind byte
	err := s.object(func(key []byte) error {
		kind, v, err := s.span()
		if err != nil {
			return err
		}
		switch {
		case bytes.Equal(key, keyRole):
			if kind != '"' {
				return fmt.Errorf("%w: messages[%d].role must be a string", ErrInvalidRequest, i)
			}
			role = v[1 : len(v)-1]
		case bytes.Equal(key, keyContent):
			if kind != '"' && kind != '[' && kind != 'z' {
				return fmt.Errorf("%w: messages[%d].content must be a string, an array of parts or null", ErrInvalidRequest, i)
			}
			content, contentKind = v, kind
		}
		return nil
	})
	if err != nil {
		return err
	}
	if role == nil {
		return fmt.Errorf("%w: messages[%d].role is required", ErrInvalidRequest, i)
	}
	return writeMessage(role, content, contentKind, "messages", i, pw)
}

// writeMessage writes message i of a conversation: its role, '\n', its
// content and '\n'. The content is the raw JSON value content of kind
// kind: a string, an array of parts, or null or absent (0), which write
// nothing; field names the array the message is in, for errors.
func writeMessage(role, content []byte, kind byte, field string, i int, pw *prefixWriter) error {
	if err := pw.json(role); err != nil {
		return err
	}
	pw.raw(newline)
	switch kind {
	case '"':
		if err := pw.json(content[1 : len(content)-1]); err != nil {
			return err
		}
	case '[':
		if err := contentParts(content, i, pw); err != nil {
			return err
		}
	case 'z', 0:
	default:
		return fmt.Errorf("%w: %s[%d].content must be a string or an array of parts", ErrInvalidRequest, field, i)
	}
	pw.raw(newline)
	return nil
}

// contentParts writes the parts of a content array, joined by '\n': text
// parts (and the Responses API's input_text and output_text) as their
// text, any other part as otherPart does. A part without a string type is
// refused.
func contentParts(raw []byte, msg int, pw *prefixWriter) error {
	s := scanner{b: raw}
	parts := 0
	return s.array(func(i int) error {
		if s.peek() != '{' {
			return fmt.Errorf("%w: messages[%d].content[%d] must be an object", ErrInvalidRequest, msg, i)
		}
		from := s.i
		typ, text, textKind, err := partFields(&s, msg, i)
		if err != nil {
			return err
		}
		if typ == nil {
			return fmt.Errorf("%w: messages[%d].content[%d].type is required", ErrInvalidRequest, msg, i)
		}
		isText := bytes.Equal(typ, keyText) || bytes.Equal(typ, keyInputText) || bytes.Equal(typ, keyOutputText)
		if isText && textKind != '"' {
			return fmt.Errorf("%w: messages[%d].content[%d].text must be a string", ErrInvalidRequest, msg, i)
		}
		if parts > 0 {
			pw.raw(newline)
		}
		parts++
		if !isText {
			return otherPart(s.b[from:s.i], typ, pw)
		}
		return pw.json(text[1 : len(text)-1])
	})
}

// partFields consumes part i of message msg's content at the cursor and
// returns its type (nil when absent) and its text field with the text's
// kind.
func partFields(s *scanner, msg, i int) (typ, text []byte, textKind byte, err error) {
	err = s.object(func(key []byte) error {
		kind, v, err := s.span()
		if err != nil {
			return err
		}
		switch {
		case bytes.Equal(key, keyType):
			if kind != '"' {
				return fmt.Errorf("%w: messages[%d].content[%d].type must be a string", ErrInvalidRequest, msg, i)
			}
			typ = v[1 : len(v)-1]
		case bytes.Equal(key, keyText):
			text, textKind = v, kind
		}
		return nil
	})
	return typ, text, textKind, err
}

// otherPart writes a part that is not text, given its raw JSON: "\x00",
// its type, '\n' and the JSON of the field its type names (an image_url's
// object, an input_audio's data), failing that of the whole part, without
// white space.
func otherPart(part, typ []byte, pw *prefixWriter) error {
	payload := part
	sub := scanner{b: part}
	_ = sub.object(func(key []byte) error {
		_, v, err := sub.span()
		if err == nil && bytes.Equal(key, typ) {
			payload = v
		}
		return err
	})
	pw.raw(partMarker)
	if err := pw.json(typ); err != nil {
		return err
	}
	pw.raw(newline)
	compactJSON(payload, pw)
	return nil
}

// promptPrefix consumes a completions prompt at the cursor and writes it: a
// string, the first of an array of strings, or token ids (an array, or the
// first of an array of arrays).
func promptPrefix(s *scanner, pw *prefixWriter) error {
	kind, raw, err := s.spanOrArray()
	switch {
	case err != nil:
		return err
	case kind == '"':
		return pw.json(raw[1 : len(raw)-1])
	case kind != '[':
		return fmt.Errorf("%w: prompt must be a string, an array of strings or an array of token ids", ErrInvalidRequest)
	}
	var first byte
	return s.array(func(i int) error {
		kind, v, err := s.span()
		if err != nil {
			return err
		}
		if i == 0 {
			first = kind
		} else if kind != first {
			return fmt.Errorf("%w: prompt array mixes types", ErrInvalidRequest)
		}
		switch kind {
		case '"':
			if i == 0 {
				return pw.json(v[1 : len(v)-1])
			}
		case 'n':
			return tokenID(v, pw)
		case '[':
			if i == 0 {
				return tokenIDs(v, pw)
			}
		default:
			return fmt.Errorf("%w: prompt[%d] must be a string, a token id or an array of token ids", ErrInvalidRequest, i)
		}
		return nil
	})
}

func tokenIDs(raw []byte, pw *prefixWriter) error {
	s := scanner{b: raw}
	return s.array(func(i int) error {
		kind, v, err := s.span()
		if err != nil {
			return err
		}
		if kind != 'n' {
			return fmt.Errorf("%w: token ids must be integers", ErrInvalidRequest)
		}
		return tokenID(v, pw)
	})
}

func tokenID(v []byte, pw *prefixWriter) error {
	if _, err := strconv.ParseUint(string(v), 10, 32); err != nil {
		return fmt.Errorf("%w: token id %.20q is not a non-negative integer", ErrInvalidRequest, v)
	}
	pw.raw(v)
	pw.raw(space)
	return nil
}

// prefixWriter hashes prompt text up to limit bytes. With a fixed budget
// (fixed > 0) it notes the digest of the first fixed bytes, cut back to a
// UTF-8 boundary: the fixed-length key. With info set it notes the digest
// at every ChainBlockBytes boundary in info.Chain: the block chain, cut at
// byte boundaries (every request is cut the same way, so equal text gives
// equal blocks).
type prefixWriter struct {
	d       xxhash.Digest
	limit   int // bytes hashed at most
	written int
	// The fixed-length key: its budget, whether it was cut, the digest
	// and length at the cut.
	fixed      int
	fixedDone  bool
	fixedSum   uint64
	fixedBytes int
	info       *KeyInfo // chain destination, or nil
}

// reset starts over: a repeated prompt field replaces the earlier one.
func (w *prefixWriter) reset() {
	w.d.Reset()
	w.written, w.fixedDone, w.fixedSum, w.fixedBytes = 0, false, 0, 0
	if w.info != nil {
		w.info.Blocks = 0
	}
}

// full reports whether nothing more will be hashed.
func (w *prefixWriter) full() bool { return w.written >= w.limit || w.fixedDone }

// raw writes p, or as much of it as the limit allows.
func (w *prefixWriter) raw(p []byte) {
	for len(p) > 0 && !w.full() {
		if w.fixed > 0 && !w.fixedDone && w.written+len(p) >= w.fixed {
			// The fixed key ends in p: cut back to the start of a rune
			// (unless p ends exactly at the budget).
			cut := w.fixed - w.written
			if cut < len(p) {
				for cut > 0 && !utf8.RuneStart(p[cut]) {
					cut--
				}
			}
			w.d.Write(p[:cut])
			w.written += cut
			w.fixedSum, w.fixedBytes, w.fixedDone = w.d.Sum64(), w.written, true
			return // limit == fixed: nothing more is hashed
		}
		n := len(p)
		if w.info != nil {
			n = min(n, ChainBlockBytes-w.written%ChainBlockBytes)
		}
		n = min(n, w.limit-w.written)
		w.d.Write(p[:n])
		w.written += n
		p = p[n:]
		if w.info != nil && w.written%ChainBlockBytes == 0 {
			w.info.Chain[w.info.Blocks] = w.d.Sum64()
			w.info.Blocks++
		}
	}
}

// json writes the unescaped content of a raw JSON string.
func (w *prefixWriter) json(raw []byte) error {
	var buf [utf8.UTFMax]byte
	for len(raw) > 0 && !w.full() {
		// Escapes only shorten text, so nothing past left+1 raw bytes can
		// be written (raw needs the byte at the cut to find a rune start):
		// the search for an escape stops there.
		win := raw
		if left := w.limit - w.written; len(win) > left+1 {
			win = win[:left+1]
		}
		i := bytes.IndexByte(win, '\\')
		if i < 0 {
			w.raw(win)
			return nil
		}
		w.raw(raw[:i])
		r, n, err := decodeEscape(raw[i:], &buf)
		if err != nil {
			return err
		}
		w.raw(r)
		raw = raw[i+n:]
	}
	return nil
}

// writeString hashes the unescaped content of a raw JSON string.
func writeString(d *xxhash.Digest, raw []byte) error {
	var buf [utf8.UTFMax]byte
	for len(raw) > 0 {
		i := bytes.IndexByte(raw, '\\')
		if i < 0 {
			d.Write(raw)
			return nil
		}
		d.Write(raw[:i])
		r, n, err := decodeEscape(raw[i:], &buf)
		if err != nil {
			return err
		}
		d.Write(r)
		raw = raw[i+n:]
	}
	return nil
}
