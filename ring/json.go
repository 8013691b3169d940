package ring

import (
	"bytes"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds JSON nesting. Real requests (tools with JSON schemas
// included) stay far below it; deeper bodies are refused, not recursed into.
const maxDepth = 256

// scanner is a validating, allocation-free JSON cursor. It never decodes
// into maps: strings are skipped with bytes.IndexByte and returned as raw
// spans, so a 64 KiB prompt costs a few memchr calls.
type scanner struct {
	b     []byte
	i     int
	depth int
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (s *scanner) ws() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format+" at byte %d", append([]any{ErrMalformedJSON}, append(args, s.i)...)...)
}

// peek returns the next non-space byte without consuming it, or 0 at EOF.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		if s.i >= len(s.b) {
			return s.errorf("unexpected end of input, want %q", c)
		}
		return s.errorf("unexpected %q, want %q", s.b[s.i], c)
	}
	s.i++
	return nil
}

// str consumes a string at the cursor (after whitespace) and returns its raw
// content, escapes undecoded.
func (s *scanner) str() ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	start := s.i
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			s.i = len(s.b)
			return nil, s.errorf("unterminated string")
		}
		q := s.i + j
		// A quote is escaped iff an odd run of backslashes precedes it.
		k := q
		for k > start && s.b[k-1] == '\\' {
			k--
		}
		s.i = q + 1
		if (q-k)%2 == 0 {
			return s.b[start:q], nil
		}
	}
}

// value consumes any JSON value and returns its kind: '"', '{', '[', 'n'
// (number), 't', 'f' or 'z' (null).
func (s *scanner) value() (byte, error) {
	switch c := s.peek(); c {
	case '"':
		_, err := s.str()
		return '"', err
	case '{':
		return '{', s.object(nil)
	case '[':
		return '[', s.array(nil)
	case 't':
		return 't', s.literal("true")
	case 'f':
		return 'f', s.literal("false")
	case 'n':
		return 'z', s.literal("null")
	case 0:
		return 0, s.errorf("unexpected end of input")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return 'n', s.number()
		}
		return 0, s.errorf("unexpected %q", c)
	}
}

func (s *scanner) literal(lit string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return s.errorf("invalid literal")
	}
	s.i += len(lit)
	return nil
}

// number consumes a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		s.i = i
		return s.errorf("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			s.i = i
			return s.errorf("invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			s.i = i
			return s.errorf("invalid number")
		}
	}
	s.i = i
	return nil
}

// object consumes an object. For each member it calls field with the raw
// key (escapes undecoded) and the cursor at the value; field must consume
// the value. A nil field skips every value.
func (s *scanner) object(field func(key []byte) error) error {
	if empty, err := s.enter('{', '}'); empty || err != nil {
		return err
	}
	defer func() { s.depth-- }()
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if field != nil {
			err = field(key)
		} else {
			_, err = s.value()
		}
		if err != nil {
			return err
		}
		if done, err := s.next('}', "object"); done || err != nil {
			return err
		}
	}
}

// array consumes an array, calling elem with the cursor at each element;
// elem must consume it. A nil elem skips every element.
func (s *scanner) array(elem func(i int) error) error {
	if empty, err := s.enter('[', ']'); empty || err != nil {
		return err
	}
	defer func() { s.depth-- }()
	for n := 0; ; n++ {
		var err error
		if elem != nil {
			err = elem(n)
		} else {
			_, err = s.value()
		}
		if err != nil {
			return err
		}
		if done, err := s.next(']', "array"); done || err != nil {
			return err
		}
	}
}

// enter consumes the opening byte of an object or array and reports
// whether it is empty (the closing byte, consumed, follows at once). A
// non-empty one is a level deeper: the caller leaves it with s.depth--.
func (s *scanner) enter(open, close byte) (empty bool, err error) {
	if err := s.expect(open); err != nil {
		return false, err
	}
	if s.depth+1 > maxDepth {
		return false, fmt.Errorf("%w: more than %d levels", ErrTooDeep, maxDepth)
	}
	if s.peek() == close {
		s.i++
		return true, nil
	}
	s.depth++
	return false, nil
}

// next consumes what follows a member of an object or an element of an
// array: a ',' (more follow) or the closing byte (done).
func (s *scanner) next(close byte, what string) (done bool, err error) {
	switch s.peek() {
	case ',':
		s.i++
		return false, nil
	case close:
		s.i++
		return true, nil
	}
	return false, s.errorf("want ',' or '%c' in %s", close, what)
}

// end checks that only whitespace follows the top-level value.
func (s *scanner) end() error {
	if s.peek() != 0 {
		return s.errorf("trailing data after JSON value")
	}
	return nil
}

// span consumes a value and returns its kind and raw bytes.
func (s *scanner) span() (byte, []byte, error) {
	s.ws()
	start := s.i
	kind, err := s.value()
	return kind, s.b[start:s.i], err
}

// decodeEscape decodes the escape sequence at the start of raw (raw[0] ==
// '\\') into buf and returns the bytes and how much of raw it consumed.
func decodeEscape(raw []byte, buf *[utf8.UTFMax]byte) ([]byte, int, error) {
	if len(raw) < 2 {
		return nil, 0, fmt.Errorf("%w: truncated escape", ErrMalformedJSON)
	}
	var c byte
	switch raw[1] {
	case '"', '\\', '/':
		c = raw[1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r, ok := hex4(raw[2:])
		if !ok {
			return nil, 0, fmt.Errorf("%w: invalid \\u escape", ErrMalformedJSON)
		}
		n := 6
		if utf16.IsSurrogate(r) {
			r2 := rune(-1)
			if len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
				r2, _ = hex4(raw[8:])
			}
			if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
				r, n = dec, 12
			} else {
				r = utf8.RuneError
			}
		}
		return buf[:utf8.EncodeRune(buf[:], r)], n, nil
	default:
		return nil, 0, fmt.Errorf("%w: invalid escape \\%c", ErrMalformedJSON, raw[1])
	}
	buf[0] = c
	return buf[:1], 2, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// spanOrArray consumes a value other than an array and returns its kind and
// raw bytes; at an array it consumes nothing and returns '['.
func (s *scanner) spanOrArray() (byte, []byte, error) {
	if s.peek() == '[' {
		return '[', nil, nil
	}
	return s.span()
}
