package proc

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeAddrsDistinctAndBelowEphemeral(t *testing.T) {
	addrs, err := FreeAddrs("127.0.0.1", 50)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := quietPorts()
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
		_, p, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if hi > lo && (port < lo || port >= hi) {
			t.Errorf("%s outside [%d, %d), the span below the ephemeral range", a, lo, hi)
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s is not free: %v", a, err)
		}
		ln.Close()
	}
}
