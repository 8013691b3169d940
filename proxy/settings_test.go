package proxy

import (
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/bytesize"
)

// TestBodyMemoryAtLeastTwiceBodySize: max body memory must be at least
// twice the max body size, up to the largest size a setting may hold
// (2^62 bytes, which doubled overflows an int64).
func TestBodyMemoryAtLeastTwiceBodySize(t *testing.T) {
	const most = bytesize.Size(1) << 62
	for _, c := range []struct {
		size, memory bytesize.Size
		ok           bool
	}{
		{32 << 20, 64 << 20, true},
		{32 << 20, 64<<20 - 1, false},
		{1 << 10, 2 << 10, true},
		{most / 2, most, true},
		{most/2 + 1, most, false},
		{most, most, false},
		{most, 1 << 30, false},
	} {
		cfg := DefaultConfig()
		cfg.MaxBodySize, cfg.MaxBodyMemory = c.size, c.memory
		err := cfg.Validate()
		refused := err != nil && strings.Contains(err.Error(), "max body memory must be at least twice")
		if refused == c.ok {
			t.Errorf("size %d, memory %d: %v", c.size, c.memory, err)
		}
	}
}
