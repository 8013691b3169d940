package cluster

import (
	"bytes"
	"testing"
)

func TestPreambleRoundTrip(t *testing.T) {
	for _, id := range []string{"", "0123456789abcdef0123456789abcdef"} {
		for _, b := range []byte{modeRaft, modeProbe, statusOK, statusForeign} {
			got, gotID, err := readPreamble(bytes.NewReader(appendPreamble(nil, b, id)))
			if err != nil || got != b || gotID != id {
				t.Fatalf("%q %c: got %c %q %v", id, b, got, gotID, err)
			}
		}
	}
	for _, bad := range []string{"", "WRAFT", "HTTP/1.1 200 OK\r\n\r\n", "WRAFT\x02R\x00", "WRAFT\x01R\x41" + string(bytes.Repeat([]byte("a"), 65)),
		"WRAFT\x01R\x02ZZ", "\x16\x03\x01\x00\x05hello"} {
		if _, _, err := readPreamble(bytes.NewReader([]byte(bad))); err == nil {
			t.Errorf("readPreamble(%q) accepted", bad)
		}
	}
	if !sameCluster("", "ab") || !sameCluster("ab", "ab") || sameCluster("ab", "cd") {
		t.Fatal("sameCluster")
	}
}

// FuzzPreamble: the preamble reader never panics, reads no more than the
// preamble, and what it accepts writes back byte for byte.
func FuzzPreamble(f *testing.F) {
	f.Add(appendPreamble(nil, modeRaft, "0123456789abcdef0123456789abcdef"))
	f.Add(appendPreamble(nil, modeProbe, ""))
	f.Add([]byte("WRAFT\x01R\xffabc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		mode, id, err := readPreamble(r)
		if err != nil {
			return
		}
		n := len(b) - r.Len()
		if out := appendPreamble(nil, mode, id); !bytes.Equal(out, b[:n]) {
			t.Fatalf("accepted %q, writes back %q", b[:n], out)
		}
		if checkClusterID(id) != nil {
			t.Fatalf("accepted cluster id %q", id)
		}
	})
}
