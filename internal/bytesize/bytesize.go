package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a byte count that reads "32MiB", "512KiB", "4096" or "1GB".
type Size int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
}

// Parse parses a byte count with an optional unit.
func Parse(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q (want e.g. 4096, 512KiB, 32MiB)", s)
	}
	return Size(n * mult), nil
}

func (s Size) String() string {
	switch {
	case s >= 1<<30 && s%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", s>>30)
	case s >= 1<<20 && s%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", s>>20)
	case s >= 1<<10 && s%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", s>>10)
	}
	return strconv.FormatInt(int64(s), 10)
}

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := Parse(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// UnmarshalText implements encoding.TextUnmarshaler (YAML, env).
func (s *Size) UnmarshalText(b []byte) error { return s.Set(string(b)) }

// MarshalText implements encoding.TextMarshaler.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
