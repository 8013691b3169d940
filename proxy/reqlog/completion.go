package reqlog

import "bytes"

// completionKey is the key CompletionScan looks for.
const completionKey = `"completion_tokens":`

// maxCountDigits bounds a token count read by CompletionScan, as the
// proxy's usage scan bounds its counts: under 10^9.
const maxCountDigits = 9

// CompletionScan finds the last "completion_tokens" count of an answer
// fed in pieces (a JSON body, or every event of a stream; vLLM's last
// usage report counts the whole answer). It matches the key wherever it
// stands, which is enough for an estimate: a key written inside a string
// value has escaped quotes and never matches. The zero value is ready;
// it holds no bytes of the answer.
type CompletionScan struct {
	m    uint8 // bytes of completionKey matched; len(completionKey) in the value
	num  int64
	nd   uint8
	seen bool
	last int64
}

// Tokens returns the last count found, or -1.
func (c *CompletionScan) Tokens() int64 {
	if !c.seen {
		return -1
	}
	return c.last
}

// Feed scans the next piece of the answer.
func (c *CompletionScan) Feed(p []byte) {
	const n = uint8(len(completionKey))
	for i := 0; i < len(p); i++ {
		if c.m == 0 {
			q := bytes.IndexByte(p[i:], '"')
			if q < 0 {
				return
			}
			i += q
			c.m = 1
			continue
		}
		ch := p[i]
		if c.m < n {
			switch {
			case ch == completionKey[c.m]:
				c.m++
				c.num, c.nd = 0, 0
			case c.m == n-1 && isSpace(ch): // between the key and ':'
			case ch == '"':
				c.m = 1
			default:
				c.m = 0
			}
			continue
		}
		switch {
		case '0' <= ch && ch <= '9' && c.nd < maxCountDigits && !(c.nd == 1 && c.num == 0):
			c.num = c.num*10 + int64(ch-'0')
			c.nd++
		case isSpace(ch) && c.nd == 0:
		default:
			if c.nd > 0 && (ch == ',' || ch == '}' || isSpace(ch)) {
				c.last, c.seen = c.num, true
			}
			c.m = 0
			if ch == '"' {
				c.m = 1
			}
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
