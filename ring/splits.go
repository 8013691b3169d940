package ring

import (
	"fmt"
	"slices"
	"strings"
)

// KeyDepth says how deep into the prompt PREFIX_AWARE's key reaches.
type KeyDepth uint8

const (
	// FixedDepth keys on the first PrefixLength bytes of prompt text
	// (SageMaker's rule).
	FixedDepth KeyDepth = iota
	// AdaptiveDepth keys on the shortest prefix of the prompt's block chain
	// that is not split: one block (ChainBlockBytes) unless the agreed
	// Splits say that prefix carries more traffic than one backend should
	// take, in which case one block deeper, and so on. PrefixLength is not
	// used.
	AdaptiveDepth
)

var keyDepthNames = [...]string{FixedDepth: "FIXED", AdaptiveDepth: "ADAPTIVE"}

func (k KeyDepth) String() string {
	if int(k) < len(keyDepthNames) {
		return keyDepthNames[k]
	}
	return fmt.Sprintf("KeyDepth(%d)", uint8(k))
}

// MarshalText implements encoding.TextMarshaler.
func (k KeyDepth) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: FIXED or ADAPTIVE, in
// any case.
func (k *KeyDepth) UnmarshalText(b []byte) error {
	i := slices.Index(keyDepthNames[:], strings.ToUpper(strings.TrimSpace(string(b))))
	if i < 0 {
		return fmt.Errorf("%w: unknown key depth %q (want ADAPTIVE or FIXED)", ErrConfig, b)
	}
	*k = KeyDepth(i)
	return nil
}

// OverflowRule says when PREFIX_AWARE leaves a key's owner.
type OverflowRule uint8

const (
	// ThresholdOverflow leaves the owner when it has ConcurrencyThreshold
	// requests in flight (or, with BusyIsFull, when its engine queues).
	ThresholdOverflow OverflowRule = iota
	// CostOverflow also leaves the owner below the threshold, but only
	// when that pays: the owner has requests waiting for their first token
	// (a queue) while a later backend in the key's order has none and
	// fewer in flight, and the owner's queue is longer than the prefill the
	// request would redo on that backend. When every candidate queues too,
	// the request waits on the warm owner: overflow never adds prefill
	// work to a fleet that is already busy. ConcurrencyThreshold stays a
	// hard cap.
	CostOverflow
)

var overflowNames = [...]string{ThresholdOverflow: "THRESHOLD", CostOverflow: "COST"}

func (o OverflowRule) String() string {
	if int(o) < len(overflowNames) {
		return overflowNames[o]
	}
	return fmt.Sprintf("OverflowRule(%d)", uint8(o))
}

// MarshalText implements encoding.TextMarshaler.
func (o OverflowRule) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: THRESHOLD or COST, in
// any case.
func (o *OverflowRule) UnmarshalText(b []byte) error {
	i := slices.Index(overflowNames[:], strings.ToUpper(strings.TrimSpace(string(b))))
	if i < 0 {
		return fmt.Errorf("%w: unknown overflow rule %q (want COST or THRESHOLD)", ErrConfig, b)
	}
	*o = OverflowRule(i)
	return nil
}

// Split marks a prefix that carries more traffic than one backend should
// take: a request whose key at Depth (KeyInfo.KeyAt) is Key routes on a
// deeper prefix, so the prefix's continuations (conversations, documents)
// spread over the fleet while each stays on one backend.
type Split struct {
	Key   uint64 `json:"key,string"`
	Depth int    `json:"depth"`
}

// MaxSplits bounds a split set.
const MaxSplits = 4096

// SplitLookahead is how many blocks past the deepest split Extract reads,
// so that the next level of a hot prefix can be counted before it is split:
// with no split, 8 KiB, so a shared prefix of that length (an agent's tool
// prompt) is split in one round instead of one 4 KiB step a round, and
// sessions that start between two rounds do not lose their history at the
// second. It costs about 200 ns on a 16 KiB prompt (BenchmarkRouteAdaptive).
const SplitLookahead = 7

// Splits is an immutable set of splits. The nil *Splits is the empty set.
type Splits struct {
	// keys is an open-addressing set (linear probing, at most half full);
	// 0 marks an empty slot, so key 0 is held in hasZero.
	keys     []uint64
	hasZero  bool
	list     []Split
	maxDepth int // deepest split + 1
}

// NewSplits builds a set from list (any order, duplicates merged). It
// rejects more than MaxSplits splits and depths outside [0, MaxChainBlocks).
func NewSplits(list []Split) (*Splits, error) {
	if len(list) > MaxSplits {
		return nil, fmt.Errorf("%w: %d splits, at most %d", ErrConfig, len(list), MaxSplits)
	}
	size := 4
	for size < 2*len(list) {
		size *= 2
	}
	s := &Splits{keys: make([]uint64, size)}
	for _, sp := range list {
		if sp.Depth < 0 || sp.Depth >= MaxChainBlocks {
			return nil, fmt.Errorf("%w: split depth %d out of range [0, %d)", ErrConfig, sp.Depth, MaxChainBlocks)
		}
		if !s.add(sp.Key) {
			continue // a duplicate
		}
		s.list = append(s.list, sp)
		s.maxDepth = max(s.maxDepth, sp.Depth+1)
	}
	SortSplits(s.list)
	return s, nil
}

// SortSplits sorts list by depth, then key: the canonical order.
func SortSplits(list []Split) {
	slices.SortFunc(list, func(a, b Split) int {
		if a.Depth != b.Depth {
			return a.Depth - b.Depth
		}
		switch {
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
}

// Len is the number of splits.
func (s *Splits) Len() int {
	if s == nil {
		return 0
	}
	return len(s.list)
}

// List returns the splits in canonical order; do not modify it.
func (s *Splits) List() []Split {
	if s == nil {
		return nil
	}
	return s.list
}

// add inserts key, reporting false when it was there already.
func (s *Splits) add(key uint64) bool {
	if key == 0 {
		added := !s.hasZero
		s.hasZero = true
		return added
	}
	mask := uint64(len(s.keys) - 1)
	for i := fmix64(key) & mask; ; i = (i + 1) & mask {
		switch s.keys[i] {
		case key:
			return false
		case 0:
			s.keys[i] = key
			return true
		}
	}
}

// Has reports whether key is split.
func (s *Splits) Has(key uint64) bool {
	if s == nil {
		return false
	}
	if key == 0 {
		return s.hasZero
	}
	mask := uint64(len(s.keys) - 1)
	for i := fmix64(key) & mask; ; i = (i + 1) & mask {
		switch s.keys[i] {
		case key:
			return true
		case 0:
			return false
		}
	}
}

// ChainBlocks is how many blocks Extract must read for s: the deepest
// split, the block past it and SplitLookahead more.
func (s *Splits) ChainBlocks() int {
	d := 0
	if s != nil {
		d = s.maxDepth
	}
	return min(d+1+SplitLookahead, MaxChainBlocks)
}

// Depth returns the depth PREFIX_AWARE routes info on: the first block
// whose key is not split, or info.Blocks (all the text read) when every
// full block is split. KeyAt(Depth(info)) is the routing key.
func (s *Splits) Depth(info *KeyInfo) int {
	for d := 0; d < info.Blocks; d++ {
		if !s.Has(info.KeyAt(d)) {
			return d
		}
	}
	return info.Blocks
}

// Route sets info.Key to the key PREFIX_AWARE routes on under s (see
// Depth) and info.PrefixBytes to the bytes of prompt text in it, and
// returns the depth.
func (s *Splits) Route(info *KeyInfo) int {
	d := s.Depth(info)
	info.Key = info.KeyAt(d)
	if d < info.Blocks {
		info.PrefixBytes = (d + 1) * ChainBlockBytes
	}
	return d
}

// HeaderName is an HTTP header field name setting: empty (off), or 1-64
// token characters (RFC 9110).
type HeaderName string

// maxHeaderName bounds a HeaderName.
const maxHeaderName = 64

// MarshalText implements encoding.TextMarshaler.
func (h HeaderName) MarshalText() ([]byte, error) { return []byte(h), nil }

// UnmarshalText implements encoding.TextUnmarshaler: a field name, or ""
// (off). Surrounding blanks are dropped.
func (h *HeaderName) UnmarshalText(b []byte) error {
	v := strings.TrimSpace(string(b))
	if err := checkHeaderName(v); err != nil {
		return err
	}
	*h = HeaderName(v)
	return nil
}

func checkHeaderName(v string) error {
	if len(v) > maxHeaderName {
		return fmt.Errorf("%w: header name of %d bytes, at most %d", ErrConfig, len(v), maxHeaderName)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("%w: header name %q: character %q is not allowed in a field name", ErrConfig, v, c)
		}
	}
	return nil
}
