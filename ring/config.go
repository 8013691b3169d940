package ring

import (
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Strategy is a routing strategy. The names are SageMaker's where SageMaker
// has one.
type Strategy uint8

const (
	// PrefixAware sends a key to its partition's owner while the owner is
	// under its load limit, else to the first backend under the limit in
	// the partition's overflow order, else to the least loaded backend.
	PrefixAware Strategy = iota
	// Random picks a healthy backend uniformly at random.
	Random
	// LeastOutstanding picks the healthy backend with the fewest in-flight
	// requests (ties broken at random).
	LeastOutstanding
	// RoundRobin cycles through healthy backends.
	RoundRobin
	// ConsistentHash sends a key to its owner whatever the load: the
	// baseline that shows hot spots.
	ConsistentHash
)

var strategyNames = [...]string{
	PrefixAware:      "PREFIX_AWARE",
	Random:           "RANDOM",
	LeastOutstanding: "LEAST_OUTSTANDING_REQUESTS",
	RoundRobin:       "ROUND_ROBIN",
	ConsistentHash:   "CONSISTENT_HASH",
}

// Strategies lists every strategy in a fixed order.
func Strategies() []Strategy {
	return []Strategy{PrefixAware, Random, LeastOutstanding, RoundRobin, ConsistentHash}
}

func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy accepts the SageMaker names (PREFIX_AWARE, RANDOM,
// LEAST_OUTSTANDING_REQUESTS), ROUND_ROBIN and CONSISTENT_HASH, in any case
// and with '-' for '_'. LOR and LEAST_OUTSTANDING are accepted too.
func ParseStrategy(s string) (Strategy, error) {
	n := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	for i, name := range strategyNames {
		if n == name {
			return Strategy(i), nil
		}
	}
	switch n {
	case "LOR", "LEAST_OUTSTANDING":
		return LeastOutstanding, nil
	case "PREFIX", "PREFIXAWARE":
		return PrefixAware, nil
	}
	return 0, fmt.Errorf("%w: unknown strategy %q (want one of %s)", ErrConfig, s, strings.Join(strategyNames[:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (s Strategy) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Strategy) UnmarshalText(b []byte) error {
	v, err := ParseStrategy(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Limits of the knobs users set, SageMaker's where SageMaker has one.
const (
	MinPrefixLength         = 1024
	MaxPrefixLength         = 65536
	MinConcurrencyThreshold = 1
	MaxConcurrencyThreshold = 1024
	// MaxBackends bounds a ring; partitions scale with it.
	MaxBackends = 4096
)

// KeyConfig says how routing keys are read from requests.
type KeyConfig struct {
	// PrefixLength is how many bytes of prompt text feed the key (cut back
	// to a UTF-8 boundary). 1024-65536.
	PrefixLength int
	// InvocationsJSON makes /invocations extract prompt fields (messages,
	// prompt, inputs) from JSON bodies instead of hashing the raw bytes.
	InvocationsJSON bool
}

// Config is everything placement and picking depend on. The zero value is
// not valid; start from DefaultConfig.
type Config struct {
	KeyConfig

	// Strategy chooses how Pick decides.
	Strategy Strategy
	// ConcurrencyThreshold is the in-flight request count per backend (per
	// unit of weight) at which PREFIX_AWARE stops sending more to it and
	// overflows. 1-1024.
	ConcurrencyThreshold int
	// LoadFactor, when > 0, also bounds a backend's in-flight to
	// LoadFactor x the fleet's average (consistent hashing with bounded
	// loads). 0 turns it off; otherwise it must be >= 1.
	LoadFactor float64
	// BusyIsFull treats a backend whose engine reports queued requests as
	// over its limit, so PREFIX_AWARE overflows from it.
	BusyIsFull bool
	// ZoneAware makes PREFIX_AWARE overflow to backends in LocalZone before
	// others (the owner stays first wherever it is). Routers in different
	// zones then overflow a prefix to different backends: agreement across
	// routers holds within a zone.
	ZoneAware bool
	// LocalZone is the zone of the router building the ring.
	LocalZone string
	// OverflowDepth is how many backends (owner included) each partition's
	// overflow order holds. Past them, PREFIX_AWARE falls back to the least
	// loaded backend.
	OverflowDepth int

	// PartitionCount is the number of partitions keys map onto. 0 picks one
	// from the backend count (a fixed prime per size tier, so owners stay
	// put while the fleet grows within a tier).
	PartitionCount int
	// ReplicationFactor is the number of virtual nodes per backend.
	ReplicationFactor int
	// PartitionLoad bounds partitions per backend to PartitionLoad x the
	// average (buraksezer/consistent's Load). Must be > 1.
	PartitionLoad float64
	// Hash places virtual nodes and partitions. Tests may inject a readable
	// hash; production uses xxhash64.
	Hash func([]byte) uint64
}

// DefaultConfig returns the defaults: PREFIX_AWARE, PrefixLength 4096,
// ConcurrencyThreshold 16, no LoadFactor, BusyIsFull on.
func DefaultConfig() Config {
	return Config{
		KeyConfig:            KeyConfig{PrefixLength: 4096},
		Strategy:             PrefixAware,
		ConcurrencyThreshold: 16,
		BusyIsFull:           true,
		OverflowDepth:        8,
		ReplicationFactor:    200,
		PartitionLoad:        1.1,
		Hash:                 xxhash.Sum64,
	}
}

// Validate reports the first problem with c, naming the knob and its range.
func (c *Config) Validate() error {
	switch {
	case int(c.Strategy) >= len(strategyNames):
		return fmt.Errorf("%w: unknown strategy %d", ErrConfig, c.Strategy)
	case c.PrefixLength < MinPrefixLength || c.PrefixLength > MaxPrefixLength:
		return fmt.Errorf("%w: PrefixLength %d out of range [%d, %d]", ErrConfig, c.PrefixLength, MinPrefixLength, MaxPrefixLength)
	case c.ConcurrencyThreshold < MinConcurrencyThreshold || c.ConcurrencyThreshold > MaxConcurrencyThreshold:
		return fmt.Errorf("%w: ConcurrencyThreshold %d out of range [%d, %d]", ErrConfig, c.ConcurrencyThreshold, MinConcurrencyThreshold, MaxConcurrencyThreshold)
	case c.LoadFactor != 0 && (c.LoadFactor < 1 || c.LoadFactor > 100):
		return fmt.Errorf("%w: LoadFactor %g must be 0 (off) or between 1 and 100", ErrConfig, c.LoadFactor)
	case c.OverflowDepth < 1 || c.OverflowDepth > 64:
		return fmt.Errorf("%w: OverflowDepth %d out of range [1, 64]", ErrConfig, c.OverflowDepth)
	case c.PartitionCount < 0 || c.PartitionCount > 1<<20:
		return fmt.Errorf("%w: PartitionCount %d out of range [0, %d]", ErrConfig, c.PartitionCount, 1<<20)
	case c.ReplicationFactor < 1 || c.ReplicationFactor > 1000:
		return fmt.Errorf("%w: ReplicationFactor %d out of range [1, 1000]", ErrConfig, c.ReplicationFactor)
	case !(c.PartitionLoad > 1) || c.PartitionLoad > 10:
		return fmt.Errorf("%w: PartitionLoad %g must be above 1 and at most 10", ErrConfig, c.PartitionLoad)
	case c.Hash == nil:
		return fmt.Errorf("%w: Hash is nil", ErrConfig)
	}
	return nil
}

// partitionTiers are the partition counts picked when PartitionCount is 0:
// the smallest prime tier that keeps at least 20 partitions per backend.
var partitionTiers = [...]int{7919, 20011, 40009, 81901}

func (c *Config) partitions(n int) int {
	if c.PartitionCount > 0 {
		return c.PartitionCount
	}
	for _, p := range partitionTiers {
		if p >= 20*n {
			return p
		}
	}
	return partitionTiers[len(partitionTiers)-1]
}
