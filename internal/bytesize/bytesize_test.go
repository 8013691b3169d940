package bytesize

import (
	"strconv"
	"testing"
)

// FuzzParse: an accepted size is non-negative and within the parser's
// bound, and its String form (and MarshalText) parses back to it.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"32MiB", "512KiB", "4096", "1GB", "1GiB", "0", " 64 K ", "2M", "3G", "7B", "10KB", "5MB",
		"-1", "1.5MiB", "MiB", "", "4194304GiB", "4194305GiB", "9223372036854775807", "+5", "0x10", "1e3",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			if n != 0 {
				t.Fatalf("Parse(%q) failed but returned %d", s, n)
			}
			return
		}
		if n < 0 || n > 1<<62 {
			t.Fatalf("Parse(%q) = %d, out of [0, 2^62]", s, n)
		}
		back, err := Parse(n.String())
		if err != nil || back != n {
			t.Fatalf("Parse(%q) = %d, String %q parses to %d, %v", s, n, n.String(), back, err)
		}
		if plain, err := Parse(strconv.FormatInt(int64(n), 10)); err != nil || plain != n {
			t.Fatalf("%d in bytes parses to %d, %v", n, plain, err)
		}
		text, _ := n.MarshalText()
		var u Size
		if err := u.UnmarshalText(text); err != nil || u != n {
			t.Fatalf("MarshalText(%d) = %q, UnmarshalText gives %d, %v", n, text, u, err)
		}
	})
}
