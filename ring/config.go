package ring

import (
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Strategy is a routing strategy. The names are SageMaker's where SageMaker
// has one; strategyTable (registry.go) describes each.
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

	// numStrategies counts the strategies: a new one goes above it, with
	// its row in strategyTable.
	numStrategies
)

func (s Strategy) String() string {
	if int(s) < len(strategyTable) {
		return strategyTable[s].Name
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy accepts the strategies' names (Strategies: SageMaker's
// PREFIX_AWARE, RANDOM and LEAST_OUTSTANDING_REQUESTS, ROUND_ROBIN and
// CONSISTENT_HASH), in any case and with '-' for '_'. LOR and
// LEAST_OUTSTANDING are accepted too.
func ParseStrategy(s string) (Strategy, error) {
	n := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	for i, info := range strategyTable {
		if n == info.Name {
			return Strategy(i), nil
		}
	}
	switch n {
	case "LOR", "LEAST_OUTSTANDING":
		return LeastOutstanding, nil
	case "PREFIX", "PREFIXAWARE":
		return PrefixAware, nil
	}
	return 0, fmt.Errorf("%w: unknown strategy %q (want one of %s)", ErrConfig, s, StrategyList())
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
	// ConcurrencyThreshold 0 is "not set": no hard cap; the router learns
	// each engine's capacity from what it reports (proxy's backend.learn)
	// and uses it to judge pressure, not to refuse requests.
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
	// ChainBlocks > 0 reads the prompt's block chain instead of the
	// fixed-length key: up to ChainBlocks blocks of ChainBlockBytes (at
	// most MaxChainBlocks), for KeyInfo.KeyAt. PrefixLength is then unused.
	ChainBlocks int
}

// Settings are the routing settings an operator sets. This one type is
// what the serve flags, the YAML routing block, the admin API and the
// agreed (Raft) state carry: a new setting is a field here, with its
// names in the tags, and its use.
//
// The tags: json is the name in the admin API and the Raft log (never
// change one: routers of different versions must read each other's log),
// yaml the name in the config file's routing block, flag the serve flag
// (and WARMROUTE_ variable), sagemaker the SageMaker name accepted as an
// alias, help the flag's help text (the strategy's help gets the
// strategies' names from strategyTable after it). Fields are in the order
// of the Raft log's JSON.
type Settings struct {
	Strategy             Strategy `json:"strategy" yaml:"strategy" flag:"strategy" sagemaker:"RoutingStrategy" help:"routing strategy"`
	PrefixLength         int      `json:"prefix_length" yaml:"prefix_length" flag:"prefix-length" sagemaker:"PrefixLength" help:"bytes of prompt text that form the routing key (1024-65536)"`
	ConcurrencyThreshold int      `json:"concurrency_threshold" yaml:"concurrency_threshold" flag:"concurrency-threshold" sagemaker:"ConcurrencyThreshold" help:"in-flight requests per backend at which PREFIX_AWARE overflows (1-1024); 0 = not set: no hard cap, each engine's capacity is learned from its queue"`
	LoadFactor           float64  `json:"load_factor,omitempty" yaml:"load_factor" flag:"load-factor" help:"also cap a backend at this multiple of the fleet's average in-flight (bounded loads); 0 = off, else >= 1"`
	InvocationsJSON      bool     `json:"invocations_json,omitempty" yaml:"invocations_json" flag:"invocations-json" help:"/invocations: key on prompt fields of JSON bodies (messages, prompt, inputs) instead of the raw body"`
	BusyIsFull           bool     `json:"busy_is_full,omitempty" yaml:"busy_is_full" flag:"busy-is-full" help:"THRESHOLD overflow: treat a backend whose engine reports queued requests as over its limit"`
	OverflowDepth        int      `json:"overflow_depth" yaml:"overflow_depth" flag:"overflow-depth" help:"backends in each partition's overflow order before falling back to least-loaded"`
	PartitionCount       int      `json:"partition_count,omitempty" yaml:"partition_count" flag:"partition-count" help:"ring partitions; 0 = chosen from the backend count"`
	ZoneAware            bool     `json:"zone_aware,omitempty" yaml:"zone_aware" flag:"zone-aware" help:"overflow to backends in this router's --zone first (the owner is still taken wherever it is)"`
	// KeyDepth and Overflow are the zero values (FIXED, THRESHOLD) in
	// states written before they existed, so those keep routing as then.
	KeyDepth KeyDepth     `json:"key_depth,omitempty" yaml:"key_depth" flag:"key-depth" help:"PREFIX_AWARE key: ADAPTIVE (the shortest prefix not split for carrying too much traffic, learned; PrefixLength unused) or FIXED (the first PrefixLength bytes)"`
	Overflow OverflowRule `json:"overflow,omitempty" yaml:"overflow" flag:"overflow" help:"when PREFIX_AWARE leaves a key's owner: COST (when the owner's engine queues more requests than the request's prefill is worth and a backend after it does not queue and has that many fewer in flight; the threshold stays a hard cap) or THRESHOLD (at ConcurrencyThreshold)"`
	// SessionHeader is empty (off) in states written before it existed.
	SessionHeader HeaderName `json:"session_header,omitempty" yaml:"session_header" flag:"session-header" help:"a request header (e.g. X-Session-Id, or SageMaker's X-Amzn-SageMaker-Session-Id) whose value, when a request carries it, keys the request instead of its prompt, so a conversation stays on one instance however its prompt changes; empty = off"`
}

// DefaultSettings returns the defaults: PREFIX_AWARE with ADAPTIVE keys
// and COST overflow, ConcurrencyThreshold 16 as the hard cap, no
// LoadFactor, BusyIsFull off, OverflowDepth 8 (PrefixLength 4096 serves
// FIXED keys and CONSISTENT_HASH).
func DefaultSettings() Settings {
	return Settings{
		Strategy:             PrefixAware,
		PrefixLength:         4096,
		ConcurrencyThreshold: 16,
		OverflowDepth:        8,
		KeyDepth:             AdaptiveDepth,
		Overflow:             CostOverflow,
	}
}

// Adaptive reports whether s routes PREFIX_AWARE on adaptive keys.
func (s Settings) Adaptive() bool { return s.Strategy == PrefixAware && s.KeyDepth == AdaptiveDepth }

// Key is the key-reading part of s.
func (s Settings) Key() KeyConfig {
	return KeyConfig{PrefixLength: s.PrefixLength, InvocationsJSON: s.InvocationsJSON}
}

// Validate reports the first setting out of its range, naming it.
func (s *Settings) Validate() error {
	switch {
	case int(s.Strategy) >= len(strategyTable):
		return fmt.Errorf("%w: unknown strategy %d", ErrConfig, s.Strategy)
	case s.PrefixLength < MinPrefixLength || s.PrefixLength > MaxPrefixLength:
		return fmt.Errorf("%w: PrefixLength %d out of range [%d, %d]", ErrConfig, s.PrefixLength, MinPrefixLength, MaxPrefixLength)
	case s.ConcurrencyThreshold != 0 && (s.ConcurrencyThreshold < MinConcurrencyThreshold || s.ConcurrencyThreshold > MaxConcurrencyThreshold):
		return fmt.Errorf("%w: ConcurrencyThreshold %d out of range [%d, %d], or 0 (not set: learned from the engines)", ErrConfig, s.ConcurrencyThreshold, MinConcurrencyThreshold, MaxConcurrencyThreshold)
	case s.LoadFactor != 0 && (s.LoadFactor < 1 || s.LoadFactor > 100):
		return fmt.Errorf("%w: LoadFactor %g must be 0 (off) or between 1 and 100", ErrConfig, s.LoadFactor)
	case s.OverflowDepth < 1 || s.OverflowDepth > 64:
		return fmt.Errorf("%w: OverflowDepth %d out of range [1, 64]", ErrConfig, s.OverflowDepth)
	case int(s.KeyDepth) >= len(keyDepthNames):
		return fmt.Errorf("%w: unknown key depth %d", ErrConfig, s.KeyDepth)
	case int(s.Overflow) >= len(overflowNames):
		return fmt.Errorf("%w: unknown overflow rule %d", ErrConfig, s.Overflow)
	case s.PartitionCount < 0 || s.PartitionCount > 1<<20:
		return fmt.Errorf("%w: PartitionCount %d out of range [0, %d]", ErrConfig, s.PartitionCount, 1<<20)
	}
	if err := checkHeaderName(string(s.SessionHeader)); err != nil {
		return fmt.Errorf("SessionHeader: %w", err)
	}
	return nil
}

// Config is everything placement and picking depend on: the operator's
// Settings and the ring's own knobs. The zero value is not valid; start
// from DefaultConfig.
type Config struct {
	Settings

	// LocalZone is the zone of the router building the ring.
	LocalZone string
	// ReplicationFactor is the number of virtual nodes per backend.
	ReplicationFactor int
	// PartitionLoad bounds partitions per backend to PartitionLoad x the
	// average (buraksezer/consistent's Load). Must be > 1.
	PartitionLoad float64
	// Hash places virtual nodes and partitions. Tests may inject a readable
	// hash; production uses xxhash64.
	Hash func([]byte) uint64
}

// DefaultConfig returns DefaultSettings and the ring's own defaults.
func DefaultConfig() Config {
	return ConfigFor(DefaultSettings())
}

// ConfigFor returns the ring configuration for s, with the ring's own
// defaults.
func ConfigFor(s Settings) Config {
	return Config{
		Settings:          s,
		ReplicationFactor: 200,
		PartitionLoad:     1.1,
		Hash:              xxhash.Sum64,
	}
}

// Validate reports the first problem with c, naming the knob and its range.
func (c *Config) Validate() error {
	if err := c.Settings.Validate(); err != nil {
		return err
	}
	switch {
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

// CheckFleet reports what only the backend count shows: more backends than
// a ring holds, or fewer partitions than backends. It is the cheap part of
// what New checks, for validating a configuration without building it.
func (c *Config) CheckFleet(n int) error {
	switch {
	case n > MaxBackends:
		return fmt.Errorf("%w: %d backends, at most %d", ErrConfig, n, MaxBackends)
	case n > 0 && c.partitions(n) < n:
		return fmt.Errorf("%w: PartitionCount %d is below the backend count %d", ErrConfig, c.partitions(n), n)
	}
	return nil
}

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
