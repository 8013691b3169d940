package node

import (
	"testing"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/testkit"
)

func TestAgreedUnit(t *testing.T) {
	fig := func(node string, unit, requests uint64, answers bool) gossip.CostReport {
		return gossip.CostReport{Node: node, CostFigure: gossip.CostFigure{Unit: unit, Requests: requests, FromAnswers: answers}}
	}
	for _, tc := range []struct {
		name    string
		reports []gossip.CostReport
		want    int64
	}{
		{"none", nil, 0},
		{"no traffic", []gossip.CostReport{fig("", 900, 0, false)}, 0},
		{"one router", []gossip.CostReport{fig("", 900, 3, false)}, 900},
		{"the median", []gossip.CostReport{
			fig("", 1000, 3, false), fig("b", 2000, 3, false), fig("c", 1500, 3, false),
			fig("d", 0, 50, false), // no unit yet
		}, 1500},
		{"weighted, capped at the median router's weight", []gossip.CostReport{
			fig("", 1000, 1, false), fig("b", 1200, 5, false), fig("c", 1400, 5, false), fig("d", 3000, 5, false),
		}, 1400},
		{"answers first", []gossip.CostReport{
			fig("", 1000, 30, false), fig("b", 400, 1, true), fig("c", 600, 1, true),
		}, 400},
		{"answers without traffic count for nothing", []gossip.CostReport{
			fig("", 1000, 30, false), fig("b", 400, 0, true),
		}, 1000},
		{"out of range", []gossip.CostReport{
			fig("", 1<<40, 1<<40, false), fig("b", 700, 1, false),
		}, 700},
		// One router claiming a huge count and an extreme unit, either
		// way, moves the unit at most to the nearest of the others'.
		{"one router pulls low", []gossip.CostReport{
			fig("", 1000, 10, false), fig("b", 1100, 12, false), fig("c", 1050, 8, false), fig("x", 1, 1<<40, false),
		}, 1000},
		{"one router pulls high", []gossip.CostReport{
			fig("", 1000, 10, false), fig("b", 1100, 12, false), fig("c", 1050, 8, false), fig("x", 1<<31, 1<<40, false),
		}, 1100},
	} {
		if got := agreedUnit(tc.reports); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestUnitMoved(t *testing.T) {
	for _, tc := range []struct {
		cur, next int64
		want      bool
	}{{0, 500, true}, {1000, 1000, false}, {1000, 1090, false}, {1000, 910, false}, {1000, 1200, true}, {1000, 800, true}} {
		if got := unitMoved(tc.cur, tc.next); got != tc.want {
			t.Errorf("unitMoved(%d, %d) = %v", tc.cur, tc.next, got)
		}
	}
}

// TestSettledEngine: a scrape is routed on once engineSettle old; until
// then the last settled one (or none) is, and when it settles is said.
func TestSettledEngine(t *testing.T) {
	held := map[string]gossip.EngineStats{}
	now := time.Unix(1_700_000_000, 0)
	old := gossip.EngineStats{Waiting: 2, Scraped: now.Add(-time.Second)}
	fresh := gossip.EngineStats{Waiting: 5, Scraped: now.Add(-engineSettle / 4)}
	if es, due := settledEngine(held, "b", fresh, now); !es.Scraped.IsZero() || !due.Equal(fresh.Scraped.Add(engineSettle)) {
		t.Fatalf("a fresh first scrape: routed on %+v, due %v", es, due)
	}
	if es, due := settledEngine(held, "b", old, now); es != old || !due.IsZero() {
		t.Fatalf("a settled scrape: routed on %+v, due %v", es, due)
	}
	if es, due := settledEngine(held, "b", fresh, now); es != old || due.IsZero() {
		t.Fatalf("a fresh scrape after a settled one: routed on %+v, due %v", es, due)
	}
	later := now.Add(engineSettle)
	if es, due := settledEngine(held, "b", fresh, later); es != fresh || !due.IsZero() {
		t.Fatalf("the fresh scrape once settled: routed on %+v, due %v", es, due)
	}
	// No figures (a failed scrape, none yet) go through at once.
	if es, due := settledEngine(held, "b", gossip.EngineStats{}, later); !es.Scraped.IsZero() || !due.IsZero() {
		t.Fatalf("no figures: routed on %+v, due %v", es, due)
	}
}

// TestRecomputeUnitAgreedAcrossRouters sends traffic through one follower
// only, as clients pinned to a router by their connections do: the leader
// must commit the unit the follower learns and publishes, and every
// router, the idle ones too, must weigh moves in it.
func TestRecomputeUnitAgreedAcrossRouters(t *testing.T) {
	nodes := startSplitCluster(t, false)
	var follower *Node
	for _, n := range nodes {
		if !n.agree.IsLeader() {
			follower = n
			break
		}
	}
	if follower == nil {
		t.Fatal("no follower")
	}
	stop := loadConversations(t, func(int, int) *Node { return follower })
	testkit.WaitFor(t, 20*time.Second, "every router to weigh moves in the agreed unit", func() bool {
		st, _ := nodes[0].agree.State()
		if st.RecomputeUnit <= 0 {
			return false
		}
		for _, n := range nodes {
			if n.proxy.RecomputeFigures().Agreed != st.RecomputeUnit {
				return false
			}
		}
		return true
	})
	stop()
	st, _ := nodes[0].agree.State()
	own := follower.proxy.RecomputeFigures()
	if d := float64(st.RecomputeUnit-own.Unit) / float64(own.Unit); d > 0.25 || d < -0.25 {
		t.Fatalf("agreed unit %d, the follower that carried all the traffic learnt %d", st.RecomputeUnit, own.Unit)
	}
	for _, n := range nodes {
		if n != follower {
			if f := n.proxy.RecomputeFigures(); f.Requests != 0 {
				t.Fatalf("%s weighed %d requests; the test sends none through it", n.name, f.Requests)
			}
		}
	}
}
