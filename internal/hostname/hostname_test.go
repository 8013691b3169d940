package hostname

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, h := range []string{
		"10.0.0.1", "::1", "fe80::1%eth0", "gpu-3.example", "gpu_0.gpusim.svc.cluster.local.",
		"localhost", "_vllm._tcp.example", strings.Repeat("a", 253),
	} {
		if !Valid(h) {
			t.Errorf("Valid(%q) = false, want true", h)
		}
	}
	for _, h := range []string{
		"", " ", "a b", "h:1", "[::1]", "y=h", "%80+++", "\u0088", "gpü", "h/", "h@x",
		strings.Repeat("a", 254),
	} {
		if Valid(h) {
			t.Errorf("Valid(%q) = true, want false", h)
		}
	}
}
