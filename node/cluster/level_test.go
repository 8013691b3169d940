package cluster

import (
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// TestStrategyLevels walks ring's strategy table: every strategy's level is
// one this build applies and advertises, the commands that carry routing
// settings naming it (seed, set_routing) need that level (or 2, with a
// level-2 setting beside it), and a state routing by it applies.
func TestStrategyLevels(t *testing.T) {
	for _, info := range ring.Strategies() {
		if info.Level < 1 || info.Level > CommandLevel {
			t.Errorf("%s: level %d, outside 1-%d (CommandLevel)", info.Name, info.Level, CommandLevel)
		}
		r := testRouting()
		r.Strategy, r.KeyDepth, r.Overflow = info.Strategy, ring.FixedDepth, ring.ThresholdOverflow
		for _, cmd := range []Command{SetRouting(r), Seed(testSeed(), r)} {
			if got := cmd.level(); got != info.Level {
				t.Errorf("%s: %s at level %d, want the strategy's %d", info.Name, cmd.Op, got, info.Level)
			}
		}
		r.KeyDepth = ring.AdaptiveDepth
		adaptive := SetRouting(r)
		if got, want := adaptive.level(), max(info.Level, 2); got != want {
			t.Errorf("%s with ADAPTIVE keys: level %d, want %d", info.Name, got, want)
		}
		s := mustApply(t, seeded(t), SetRouting(r))
		if s.Routing.Strategy != info.Strategy {
			t.Errorf("%s: the state routes by %s", info.Name, s.Routing.Strategy)
		}
	}
	// Commands without routing settings keep their op's level.
	for cmd, want := range map[*Command]uint8{
		{Op: OpRemoveBackend, ID: "a"}: 1,
		{Op: OpSetSplits}:              2,
		{Op: OpRevoke}:                 3,
		{Op: OpSetRecomputeUnit}:       4,
	} {
		if got := cmd.level(); got != want {
			t.Errorf("%s: level %d, want %d", cmd.Op, got, want)
		}
	}
}
