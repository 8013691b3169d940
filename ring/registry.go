package ring

import "strings"

// The tables below are the one place a strategy or a decision reason is
// described. Everything that lists them reads them from here: the
// strategies' names (flags, YAML, the admin API, the Raft log), the serve
// help and the settings docs, the command level of the agreed routing
// settings (node/cluster), the decision label of the proxy's metrics and
// headers, and the tools' lists (loadtest/fleet, warmroute demo). A new
// strategy or reason is a constant and a row here; the tests of those
// readers walk the tables and fail for a row that does not reach them.
//
// The tables are fixed when the program is built: nothing adds to them
// while it runs, and the accessors hand out copies.

// StrategyInfo describes one strategy.
type StrategyInfo struct {
	Strategy Strategy
	// Name is the strategy's name everywhere (SageMaker's where SageMaker
	// has one): flags, YAML, the admin API and the Raft log. Never change
	// one: routers of different versions read each other's log.
	Name string
	// Description says in one line how the strategy picks a backend.
	Description string
	// Key: the strategy routes on the request's key. Load: it weighs the
	// backends' load. The tools order strategies by what they know, the
	// blind baselines first.
	Key, Load bool
	// Level is the command level (node/cluster.CommandLevel) a router
	// must apply before the agreed routing settings may name the
	// strategy: a router of a lower level cannot decode the name and
	// would halt. 1 for the strategies every version knows; a new one
	// takes the level of the build that adds it.
	Level uint8
}

// strategyTable describes every Strategy, indexed by its value.
var strategyTable = [numStrategies]StrategyInfo{
	PrefixAware: {Name: "PREFIX_AWARE", Key: true, Load: true, Level: 1,
		Description: "the key's partition owner while it is under its load limit, else the first backend under the limit in the partition's overflow order, else the least loaded"},
	Random: {Name: "RANDOM", Level: 1,
		Description: "a healthy backend chosen uniformly at random"},
	LeastOutstanding: {Name: "LEAST_OUTSTANDING_REQUESTS", Load: true, Level: 1,
		Description: "the healthy backend with the fewest requests in flight, ties broken at random"},
	RoundRobin: {Name: "ROUND_ROBIN", Level: 1,
		Description: "the healthy backends in turn"},
	ConsistentHash: {Name: "CONSISTENT_HASH", Key: true, Level: 1,
		Description: "the key's owner whatever its load: the baseline that shows hot spots"},
}

// Strategies lists every strategy in the order of their values.
func Strategies() []StrategyInfo {
	out := make([]StrategyInfo, len(strategyTable))
	for i, info := range strategyTable {
		info.Strategy = Strategy(i)
		out[i] = info
	}
	return out
}

// StrategyNames lists the strategies' names in the order of their values.
func StrategyNames() []string {
	out := make([]string, len(strategyTable))
	for i, info := range strategyTable {
		out[i] = info.Name
	}
	return out
}

// StrategyList is StrategyNames joined by ", ", as help texts and errors
// give them.
func StrategyList() string { return strings.Join(StrategyNames(), ", ") }

// Info returns s's row of the strategy table; ok is false for a value that
// names no strategy.
func (s Strategy) Info() (info StrategyInfo, ok bool) {
	if int(s) >= len(strategyTable) {
		return StrategyInfo{}, false
	}
	info = strategyTable[s]
	info.Strategy = s
	return info, true
}

// ReasonInfo describes one decision reason.
type ReasonInfo struct {
	Reason Reason
	// Label is the reason's name: the decision label of
	// warmroute_requests_total, the X-Warmroute-Decision header, the
	// request log and the route explainer. Never change one: dashboards
	// and alerts select on it.
	Label string
	// Description says in one line what the decision was.
	Description string
}

// reasonTable describes every Reason, indexed by its value.
var reasonTable = [NumReasons]ReasonInfo{
	ReasonNone:             {Label: "none", Description: "nothing was picked"},
	ReasonAffinity:         {Label: "affinity", Description: "the owner of the key's partition, under its limit"},
	ReasonOverflow:         {Label: "overflow", Description: "a later backend in the partition's overflow order: the owner was full or unhealthy"},
	ReasonFallback:         {Label: "fallback", Description: "the least loaded healthy backend: every backend in the overflow order was full"},
	ReasonRandom:           {Label: "random", Description: "RANDOM's pick"},
	ReasonRoundRobin:       {Label: "round_robin", Description: "ROUND_ROBIN's pick"},
	ReasonLeastOutstanding: {Label: "least_outstanding", Description: "LEAST_OUTSTANDING_REQUESTS's pick"},
	ReasonConsistentHash:   {Label: "consistent_hash", Description: "CONSISTENT_HASH's pick: the first active, healthy backend in the key's order (the owner unless it is out), else the least loaded"},
}

// Reasons lists every decision reason in the order of their values.
func Reasons() []ReasonInfo {
	out := make([]ReasonInfo, len(reasonTable))
	for i, info := range reasonTable {
		info.Reason = Reason(i)
		out[i] = info
	}
	return out
}

// keyDepthLevels and overflowLevels are the command levels (see
// StrategyInfo.Level) of the key depths and overflow rules, indexed by
// value. The zero values (FIXED, THRESHOLD) are left out of the Raft log's
// JSON, so every version reads them; the others came with level 2. A new
// value takes the level of the build that adds it (TestSettingLevels
// fails for a value without one).
var (
	keyDepthLevels = [len(keyDepthNames)]uint8{FixedDepth: 1, AdaptiveDepth: 2}
	overflowLevels = [len(overflowNames)]uint8{ThresholdOverflow: 1, CostOverflow: 2}
)

// Level is the command level a router must apply before the agreed
// routing settings may name k: a router of a lower level cannot decode it
// and would halt. An unknown value counts as 1: settings naming it are
// refused when applied.
func (k KeyDepth) Level() uint8 {
	if int(k) < len(keyDepthLevels) {
		return keyDepthLevels[k]
	}
	return 1
}

// Level is as KeyDepth.Level, for an overflow rule.
func (o OverflowRule) Level() uint8 {
	if int(o) < len(overflowLevels) {
		return overflowLevels[o]
	}
	return 1
}
