package proxy

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzRedactQuoted: the log scrubber never panics, is idempotent, and
// leaves no quoted text but addresses.
func FuzzRedactQuoted(f *testing.F) {
	f.Add(`error when serving connection "127.0.0.1:80"<->"127.0.0.1:5": missing colon: "Authorization: Bearer x"`)
	f.Add(`"\"`)
	f.Add(`a "b\\" "c`)
	f.Fuzz(func(t *testing.T, s string) {
		out := redactQuoted(s)
		if again := redactQuoted(out); again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", s, out, again)
		}
		parts := strings.Split(out, `"`)
		for i := 1; i < len(parts); i += 2 {
			if p := parts[i]; p != "…" && !isAddr(p) && !strings.HasSuffix(parts[i-1], `\`) {
				t.Fatalf("quoted %q left in %q (from %q)", p, out, s)
			}
		}
	})
}

// FuzzFirstInvalidUTF8: the offset agrees with utf8.Valid.
func FuzzFirstInvalidUTF8(f *testing.F) {
	f.Add([]byte("café"))
	f.Add([]byte("ok\xff"))
	f.Fuzz(func(t *testing.T, p []byte) {
		i := firstInvalidUTF8(p)
		if (i < 0) != utf8.Valid(p) {
			t.Fatalf("firstInvalidUTF8 = %d, utf8.Valid = %v", i, utf8.Valid(p))
		}
		if i >= 0 && (!utf8.Valid(p[:i]) || utf8.FullRune(p[i:]) && func() bool { r, n := utf8.DecodeRune(p[i:]); return !(r == utf8.RuneError && n == 1) }()) {
			t.Fatalf("offset %d of %q is not the first invalid byte", i, p)
		}
	})
}
