package workload

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode/utf8"
)

// vocabulary is a fixed list of pseudo-words of 2-4 lowercase letters (3 on
// average, so 4 bytes with the separator: one token at 4 bytes per token).
// It is the same for every seed so that text statistics do not depend on
// the seed.
var vocabulary = buildVocabulary(1024)

func buildVocabulary(n int) []string {
	const consonants = "bcdfghjklmnprstvwz"
	const vowels = "aeiou"
	r := rand.New(rand.NewPCG(0x766f6361, 0x62756c61))
	seen := make(map[string]bool, n)
	out := make([]string, 0, n)
	var b strings.Builder
	for len(out) < n {
		b.Reset()
		l := 2 + r.IntN(3)
		for i := 0; i < l; i++ {
			if i%2 == 0 {
				b.WriteByte(consonants[r.IntN(len(consonants))])
			} else {
				b.WriteByte(vowels[r.IntN(len(vowels))])
			}
		}
		w := b.String()
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// mix64 is splitmix64's finaliser: it spreads seeds so that streams derived
// from neighbouring (seed, tag, index) triples are unrelated.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// subRand returns a generator determined by (seed, tag, index) alone.
func subRand(seed uint64, tag string, index int) *rand.Rand {
	h := mix64(seed)
	for i := 0; i < len(tag); i++ {
		h = mix64(h ^ uint64(tag[i]))
	}
	h = mix64(h ^ uint64(index))
	return rand.New(rand.NewPCG(h, mix64(h)))
}

// appendWords appends n pseudo-words to b: sentences of 6-17 words, a line
// break every few sentences. The text has no characters that JSON escapes
// other than the newline.
func appendWords(b []byte, r *rand.Rand, n int) []byte {
	sentence := 0
	for i := 0; i < n; i++ {
		w := vocabulary[r.IntN(len(vocabulary))]
		if sentence == 0 {
			sentence = 6 + r.IntN(12)
			b = append(b, w[0]-'a'+'A')
			b = append(b, w[1:]...)
		} else {
			b = append(b, w...)
		}
		sentence--
		switch {
		case i == n-1:
			b = append(b, '.')
		case sentence == 0 && r.IntN(4) == 0:
			b = append(b, ".\n"...)
		case sentence == 0:
			b = append(b, ". "...)
		default:
			b = append(b, ' ')
		}
	}
	return b
}

// appendChars appends exactly n bytes of pseudo-words to b (the last word
// may be cut): text of a length given in characters rather than tokens.
func appendChars(b []byte, r *rand.Rand, n int) []byte {
	end := len(b) + n
	for first := true; len(b) < end; first = false {
		if !first {
			b = append(b, ' ')
		}
		b = appendWords(b, r, (end-len(b))/4+1)
	}
	return b[:end]
}

// words returns n pseudo-words as a string.
func words(r *rand.Rand, n int) string {
	return string(appendWords(make([]byte, 0, n*5), r, n))
}

// codeText returns n tokens of code-looking lines.
func codeText(r *rand.Rand, n int) string {
	b := make([]byte, 0, n*6)
	depth := 0
	for t := 0; t < n; {
		for i := 0; i < depth; i++ {
			b = append(b, '\t')
		}
		switch k := r.IntN(5); {
		case k == 0 && depth < 4:
			b = append(b, "if "...)
			b = append(b, vocabulary[r.IntN(len(vocabulary))]...)
			b = append(b, " {\n"...)
			depth++
			t += 3
		case k == 1 && depth > 0:
			b = b[:len(b)-1] // one tab less
			b = append(b, "}\n"...)
			depth--
			t++
		default:
			b = append(b, vocabulary[r.IntN(len(vocabulary))]...)
			b = append(b, " := "...)
			b = append(b, vocabulary[r.IntN(len(vocabulary))]...)
			b = append(b, '(')
			b = append(b, vocabulary[r.IntN(len(vocabulary))]...)
			b = append(b, ", "...)
			b = strconv.AppendInt(b, int64(r.IntN(1000)), 10)
			b = append(b, ")\n"...)
			t += 6
		}
	}
	for ; depth > 0; depth-- {
		b = append(b, "}\n"...)
	}
	return string(b)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal (quotes included).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONEscaped(b, s)
	return append(b, '"')
}

// appendJSONEscaped appends s escaped for a JSON string, without quotes.
// Runs of plain characters are copied at once.
func appendJSONEscaped(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				i += size
				start = i
				continue
			}
			if r == '\u2028' || r == '\u2029' {
				b = append(b, s[start:i]...)
				b = append(b, `\u202`...)
				b = append(b, hexDigits[r&0xf])
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, `\u00`...)
			b = append(b, hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	return append(b, s[start:]...)
}
