package proc

import (
	"fmt"
	"net"
)

// FreeAddrs returns n distinct host:port addresses free on host right now:
// all are listened on at once (so they differ) and closed again for the
// children to bind. Another process may take one meanwhile; callers that
// care retry when a child exits at once.
func FreeAddrs(host string, n int) ([]string, error) {
	out := make([]string, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("finding a free port on %s: %w", host, err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}
