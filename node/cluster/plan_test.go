package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/gossip"
)

// cfgOf parses "a:v b:n" (v voter, n non-voter) into a configuration.
func cfgOf(spec string) []raft.Server {
	var out []raft.Server
	for _, f := range strings.Fields(spec) {
		id, kind, _ := strings.Cut(f, ":")
		s := raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + "-addr"), Suffrage: raft.Nonvoter}
		if kind == "v" {
			s.Suffrage = raft.Voter
		}
		out = append(out, s)
	}
	return out
}

// viewOf parses "a b- c=left dz2" style specs: a trailing '-' means not
// voter-eligible, "=state" sets the gossip state, "@zone" the zone.
func viewOf(spec string) *memberView {
	var ms []gossip.Member
	for _, f := range strings.Fields(spec) {
		m := gossip.Member{State: "alive", Meta: gossip.Meta{Voter: true}}
		if name, st, ok := strings.Cut(f, "="); ok {
			f, m.State = name, st
		}
		if name, zone, ok := strings.Cut(f, "@"); ok {
			f, m.Meta.Zone = name, zone
		}
		if strings.HasSuffix(f, "-") {
			f, m.Meta.Voter = strings.TrimSuffix(f, "-"), false
		}
		m.Name, m.Meta.RaftAddr = f, f+"-addr"
		ms = append(ms, m)
	}
	return buildView(ms, "a", "a-addr")
}

func actsString(acts []action) string {
	var parts []string
	for _, a := range acts {
		parts = append(parts, a.kind+":"+a.id)
	}
	return strings.Join(parts, " ")
}

func TestPlan(t *testing.T) {
	now := time.Unix(1000, 0)
	cases := []struct {
		name, cfg, view string
		voters          int
		gone            map[string]time.Time
		want            string
	}{
		{"steady 3", "a:v b:v c:v", "a b c", 3, nil, ""},
		{"joiner becomes non-voter (4 would be even)", "a:v b:v c:v", "a b c d", 5, nil, "add_nonvoter:d"},
		{"two joiners make 5 voters", "a:v b:v c:v", "a b c d e", 5, nil, "add_nonvoter:d add_nonvoter:e promote:d promote:e"},
		{"voter target 3 keeps joiners non-voters", "a:v b:v c:v", "a b c d e", 3, nil, "add_nonvoter:d add_nonvoter:e"},
		{"ineligible joiner stays non-voter", "a:v", "a b- c-", 3, nil, "add_nonvoter:b add_nonvoter:c"},
		{"single seed grows to 3", "a:v", "a b c", 3, nil, "add_nonvoter:b add_nonvoter:c promote:b promote:c"},
		{"left member removed at once", "a:v b:v c:v d:n", "a b c d=left", 3, nil, "remove:d"},
		{"missing voter kept until timeout", "a:v b:v c:v d:n", "a b d", 3, nil, ""},
		{"missing voter removed after timeout, replaced", "a:v b:v c:v d:n", "a b d", 3,
			map[string]time.Time{"c": now.Add(-time.Hour)}, "remove:c promote:d"},
		{"dead state counts as missing", "a:v b:v c:v", "a b c=dead", 3,
			map[string]time.Time{"c": now.Add(-time.Hour)}, "remove:c demote:b"}, // 1 voter beats 2
		{"4 voters after a leave: back to 3", "a:v b:v c:v d:v e:v", "a b c d e=left", 5, nil, "remove:e demote:d"},
		{"even with a missing voter: the missing one goes", "a:v b:v c:v d:v", "a b c", 5, nil, "demote:d"},
		{"too many voters demoted, never the leader", "a:v b:v c:v d:v e:v", "a b c d e", 3, nil, "demote:d demote:e"},
		{"voter that stopped wanting a vote is replaced", "a:v b:v c:v d:n", "a b c- d", 3, nil, "promote:d demote:c"},
		{"ineligible voter kept without a replacement", "a:v b:v c:v", "a b c-", 3, nil, ""},
		{"zones spread", "a:v", "a@z1 b@z1 c@z2 d@z3", 3, nil, "add_nonvoter:b add_nonvoter:c add_nonvoter:d promote:c promote:d"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gone := map[string]time.Time{}
			for k, v := range tc.gone {
				gone[k] = v
			}
			acts, _ := plan(cfgOf(tc.cfg), viewOf(tc.view), gone, now, "a", tc.voters, time.Minute)
			if got := actsString(acts); got != tc.want {
				t.Fatalf("plan = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPlanAddressChange(t *testing.T) {
	v := viewOf("a b c")
	v.servers[2].Addr = "c-new"
	acts, _ := plan(cfgOf("a:v b:v c:v"), v, map[string]time.Time{}, time.Now(), "a", 3, time.Minute)
	if len(acts) != 1 || acts[0].kind != actUpdateAddr || acts[0].addr != "c-new" || !acts[0].voter {
		t.Fatalf("acts = %+v", acts)
	}
}

func TestPlanDeadTimer(t *testing.T) {
	gone := map[string]time.Time{}
	t0 := time.Unix(1000, 0)
	acts, wait := plan(cfgOf("a:v b:v c:v"), viewOf("a b"), gone, t0, "a", 3, time.Minute)
	if len(acts) != 0 || wait != time.Minute || gone["c"] != t0 {
		t.Fatalf("first sight: acts=%v wait=%v gone=%v", acts, wait, gone)
	}
	_, wait = plan(cfgOf("a:v b:v c:v"), viewOf("a b"), gone, t0.Add(40*time.Second), "a", 3, time.Minute)
	if wait != 20*time.Second {
		t.Fatalf("wait = %v, want 20s", wait)
	}
	// Back in gossip: the clock resets.
	plan(cfgOf("a:v b:v c:v"), viewOf("a b c"), gone, t0.Add(50*time.Second), "a", 3, time.Minute)
	if _, ok := gone["c"]; ok {
		t.Fatal("gone not cleared when the server came back")
	}
	acts, _ = plan(cfgOf("a:v b:v c:v"), viewOf("a b"), gone, t0.Add(100*time.Second), "a", 3, time.Minute)
	if len(acts) != 0 {
		t.Fatalf("removed before a full timeout since it disappeared again: %v", acts)
	}
}

// TestPlanNeverLosesQuorum checks, over many configurations, that applying
// a plan's actions one at a time never leaves a configuration whose alive
// voters are not a majority, when the starting one had such a majority.
func TestPlanNeverLosesQuorum(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	states := []string{"alive", "alive-ineligible", "missing", "left"}
	n := 0
	var walk func(i int, cfg, view []string)
	walk = func(i int, cfg, view []string) {
		if i == len(ids) {
			check(t, strings.Join(cfg, " "), strings.Join(view, " "))
			n++
			return
		}
		id := ids[i]
		for _, inCfg := range []string{"", ":v", ":n"} {
			for _, st := range states {
				if i == 0 && (inCfg != ":v" || st != "alive") {
					continue // a is the leader: an alive voter
				}
				c, v := slices.Clone(cfg), slices.Clone(view)
				if inCfg != "" {
					c = append(c, id+inCfg)
				} else if st == "missing" || st == "left" {
					continue
				}
				switch st {
				case "alive":
					v = append(v, id)
				case "alive-ineligible":
					v = append(v, id+"-")
				case "left":
					v = append(v, id+"=left")
				}
				walk(i+1, c, v)
			}
		}
	}
	walk(0, nil, nil)
	if n < 1000 {
		t.Fatalf("only %d cases", n)
	}
}

func check(t *testing.T, cfgSpec, viewSpec string) {
	t.Helper()
	for _, voters := range []int{3, 5} {
		cfg := cfgOf(cfgSpec)
		view := viewOf(viewSpec)
		alive := func(id string) bool { s, ok := view.get(id); return ok && s.alive() }
		quorate := func(cfg []raft.Server) bool {
			total, up := 0, 0
			for _, s := range cfg {
				if s.Suffrage == raft.Voter {
					total++
					if alive(string(s.ID)) {
						up++
					}
				}
			}
			return 2*up > total
		}
		if !quorate(cfg) {
			continue
		}
		gone := map[string]time.Time{}
		for _, s := range cfg {
			if !alive(string(s.ID)) {
				gone[string(s.ID)] = time.Unix(0, 0) // long gone
			}
		}
		acts, _ := plan(cfg, view, gone, time.Unix(1e6, 0), "a", voters, time.Minute)
		for _, a := range acts {
			cfg = applyAction(cfg, a)
			if !quorate(cfg) {
				t.Fatalf("cfg %q view %q voters %d: %s leaves no quorum (%v)", cfgSpec, viewSpec, voters, a.kind+":"+a.id, cfg)
			}
		}
		nv := 0
		for _, s := range cfg {
			if s.Suffrage == raft.Voter {
				nv++
			}
		}
		if nv > voters {
			t.Fatalf("cfg %q view %q: %d voters after plan, target %d", cfgSpec, viewSpec, nv, voters)
		}
	}
}

func applyAction(cfg []raft.Server, a action) []raft.Server {
	cfg = slices.Clone(cfg)
	i := slices.IndexFunc(cfg, func(s raft.Server) bool { return string(s.ID) == a.id })
	switch a.kind {
	case actAddNonvoter:
		if i < 0 {
			cfg = append(cfg, raft.Server{ID: raft.ServerID(a.id), Address: raft.ServerAddress(a.addr), Suffrage: raft.Nonvoter})
		}
	case actPromote:
		cfg[i].Suffrage = raft.Voter
	case actDemote:
		cfg[i].Suffrage = raft.Nonvoter
	case actRemove:
		cfg = slices.Delete(cfg, i, i+1)
	case actUpdateAddr:
		cfg[i].Address = raft.ServerAddress(a.addr)
	default:
		panic(fmt.Sprint("unknown action ", a.kind))
	}
	return cfg
}

func TestBootstrapSet(t *testing.T) {
	cases := []struct {
		view   string
		self   string
		expect int
		want   string // IDs, or "" for not ok
	}{
		{"a b", "a", 3, ""},
		{"a b c", "a", 3, "a b c"},
		{"a b c", "c", 3, "a b c"},
		{"a b c d", "c", 3, "a b c"},
		{"a b c d", "d", 3, ""},       // not among the lowest three: waits to be added
		{"a b- c d", "d", 3, "a c d"}, // b does not want a vote
		{"a b c=left d", "d", 3, "a b d"},
		{"a b c", "b", 1, "b"},
		{"a b c d e", "e", 5, "a b c d e"},
	}
	for _, tc := range cases {
		v := viewOf(tc.view)
		set, ok := bootstrapSet(v, tc.self, tc.expect)
		var got []string
		for _, s := range set {
			got = append(got, s.ID)
		}
		if !ok {
			got = nil
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("view %q self %s expect %d: got %v, want %q", tc.view, tc.self, tc.expect, got, tc.want)
		}
	}
}
