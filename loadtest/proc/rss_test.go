package proc

import (
	"os"
	"testing"
)

func TestRSS(t *testing.T) {
	v, err := RSS(os.Getpid())
	if err != nil || v < 1<<20 || v > MaxMemBytes {
		t.Fatalf("RSS of this process: %d, %v", v, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\t-1 kB\n", "VmRSS:\tx kB\n", "VmRSS:\n", "VmRSS:\t99999999999999999 kB\n"} {
		if v, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("%q read as %d, want an error", bad, v)
		}
	}
	if v, err := parseVmRSS([]byte("Name:\tx\nVmPeak:\t  9999 kB\nVmRSS:\t   1234 kB\nThreads:\t4\n")); err != nil || v != 1234<<10 {
		t.Errorf("read as %d, %v; want %d", v, err, 1234<<10)
	}
}

func FuzzParseVmRSS(f *testing.F) {
	f.Add([]byte("Name:\tx\nVmRSS:\t   1234 kB\n"))
	f.Add([]byte("VmRSS:\t99999999999999999999 kB\n"))
	f.Add([]byte("VmRSS:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := parseVmRSS(b); err == nil && (v < 0 || v > MaxMemBytes) {
			t.Fatalf("%q read as %d", b, v)
		}
	})
}
