package proc

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreeAddrs returns n distinct host:port addresses free on host right now:
// all are listened on at once (so they differ) and closed again for the
// children to bind. Another process may take one meanwhile; callers that
// care retry when a child exits at once.
//
// The ports are drawn at random from the span just below the kernel's
// ephemeral range, which outgoing connections never take: a port handed
// out here stays free until its child binds it even while thousands of
// connections open and close, and end-to-end tests running side by side
// rarely draw the same one. Where that span cannot be read, the kernel
// picks (port 0).
func FreeAddrs(host string, n int) ([]string, error) {
	out := make([]string, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	lo, hi := quietPorts()
	for range n {
		ln, err := listenQuiet(host, lo, hi)
		if err != nil {
			return nil, fmt.Errorf("finding a free port on %s: %w", host, err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}

// quietSpan is how many ports below the ephemeral range FreeAddrs draws
// from.
const quietSpan = 12000

// quietPorts returns [lo, hi): the quietSpan ports below the ephemeral
// range, or 0, 0 when the range cannot be read or leaves no room.
func quietPorts() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first-quietSpan < 1024 || first > 65535 {
		return 0, 0
	}
	return first - quietSpan, first
}

// listenQuiet listens on a random port in [lo, hi), trying a few, then on
// port 0.
func listenQuiet(host string, lo, hi int) (net.Listener, error) {
	for i := 0; hi > lo && i < 32; i++ {
		port := lo + rand.IntN(hi-lo)
		if ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port))); err == nil {
			return ln, nil
		}
	}
	return net.Listen("tcp", net.JoinHostPort(host, "0"))
}
