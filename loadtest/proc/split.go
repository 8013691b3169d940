package proc

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrBadArgs means SplitArgs found an unterminated quote or a trailing
// backslash.
var ErrBadArgs = errors.New("unterminated quote or trailing backslash")

// SplitArgs splits a command-line value holding several flags ("--kv-blocks
// 2000 --itl-base 20ms") into words as a POSIX shell does, with no
// expansion: white space separates words; '...' keeps everything up to the
// next single quote; "..." keeps everything up to the next unescaped double
// quote, a backslash escaping " and \ there; elsewhere a backslash keeps
// the next character. A string with no quote and no backslash splits as
// strings.Fields does.
func SplitArgs(s string) ([]string, error) {
	var out []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r != utf8.RuneError && unicode.IsSpace(r):
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
			i += size
		case r == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, ErrBadArgs
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 2
			inWord = true
		case r == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				w.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, ErrBadArgs
			}
			i++
			inWord = true
		case r == '\\':
			if i+1 >= len(s) {
				return nil, ErrBadArgs
			}
			_, n := utf8.DecodeRuneInString(s[i+1:])
			w.WriteString(s[i+1 : i+1+n])
			i += 1 + n
			inWord = true
		default:
			w.WriteString(s[i : i+size])
			i += size
			inWord = true
		}
	}
	if inWord {
		out = append(out, w.String())
	}
	return out, nil
}
