package ring

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// TestStrategyTable walks the strategy table: every row is complete, its
// name is unique and is what String, ParseStrategy (in its other
// spellings too), the text encoding, Validate, the parse error, the
// setting's help and Explain use.
func TestStrategyTable(t *testing.T) {
	all := Strategies()
	if len(all) != int(numStrategies) || len(StrategyNames()) != len(all) {
		t.Fatalf("%d rows, %d names for %d strategies", len(all), len(StrategyNames()), numStrategies)
	}
	name := regexp.MustCompile(`^[A-Z][A-Z_]*[A-Z]$`)
	seen := map[string]bool{}
	_, parseErr := ParseStrategy("NOPE")
	help := ""
	for _, s := range SettingsInfo() {
		if s.JSON == "strategy" {
			help = s.Help
		}
	}
	for i, info := range all {
		s := Strategy(i)
		if info.Strategy != s {
			t.Errorf("row %d describes %d", i, info.Strategy)
		}
		if !name.MatchString(info.Name) || info.Description == "" || info.Level < 1 {
			t.Errorf("%d: incomplete row %+v (a name in upper case, a description, a level of 1 or more)", i, info)
		}
		if seen[info.Name] {
			t.Errorf("%s named twice", info.Name)
		}
		seen[info.Name] = true
		if got, ok := s.Info(); !ok || got != info {
			t.Errorf("%s: Info() = %+v, %v", info.Name, got, ok)
		}
		if s.String() != info.Name || StrategyNames()[i] != info.Name {
			t.Errorf("%d: String %q, StrategyNames %q, want %q", i, s, StrategyNames()[i], info.Name)
		}
		for _, form := range []string{info.Name, strings.ToLower(info.Name), strings.ReplaceAll(info.Name, "_", "-"), " " + info.Name + " "} {
			if got, err := ParseStrategy(form); err != nil || got != s {
				t.Errorf("ParseStrategy(%q) = %v, %v", form, got, err)
			}
		}
		text, err := s.MarshalText()
		var back Strategy
		if err != nil || string(text) != info.Name || back.UnmarshalText(text) != nil || back != s {
			t.Errorf("%s: text %q (%v) reads back as %v", info.Name, text, err, back)
		}
		st := DefaultSettings()
		st.Strategy = s
		if err := st.Validate(); err != nil {
			t.Errorf("%s: %v", info.Name, err)
		}
		if !strings.Contains(parseErr.Error(), info.Name) {
			t.Errorf("the error for an unknown strategy does not offer %s: %v", info.Name, parseErr)
		}
		if !strings.Contains(help, info.Name) {
			t.Errorf("the strategy setting's help does not list %s: %q", info.Name, help)
		}
	}
	if help != "routing strategy: "+StrategyList() {
		t.Errorf("strategy help %q", help)
	}
	if _, ok := numStrategies.Info(); ok || !strings.HasPrefix(numStrategies.String(), "Strategy(") {
		t.Errorf("a value past the table: Info ok %v, String %q", ok, numStrategies)
	}
	st := DefaultSettings()
	st.Strategy = numStrategies
	if err := st.Validate(); !errors.Is(err, ErrConfig) {
		t.Errorf("a strategy past the table validates: %v", err)
	}
}

// TestStrategiesPick: every strategy of the table picks, explains itself
// under its name and gives a reason of the reason table; a strategy that
// routes on the key (Key) is the same for the same key and loads; one that
// weighs load (Load) leaves a backend loaded far past its limit, and one
// that does not stays on it while it is up.
func TestStrategiesPick(t *testing.T) {
	const n = 7
	for _, info := range Strategies() {
		cfg := DefaultConfig()
		cfg.Strategy = info.Strategy
		r := mustRing(t, cfg, gpus(n))
		for key := uint64(1); key <= 50; key++ {
			loads := newLoads(n)
			d, err := r.Pick(key, loads)
			if err != nil || d.Backend < 0 || d.Backend >= n {
				t.Fatalf("%s: Pick(%d) = %+v, %v", info.Name, key, d, err)
			}
			if d.Reason == ReasonNone || int(d.Reason) >= len(Reasons()) {
				t.Fatalf("%s: reason %d (%s) is not in the reason table", info.Name, d.Reason, d.Reason)
			}
			if e := r.Explain(key, loads); e.Strategy != info.Name || e.Error != "" {
				t.Fatalf("%s: Explain = %+v", info.Name, e)
			}
			if info.Key {
				if again, _ := r.Pick(key, loads); again.Backend != d.Backend {
					t.Fatalf("%s (Key): key %d went to %d, then %d", info.Name, key, d.Backend, again.Backend)
				}
			}
			loads.inflight[d.Backend] = 1 << 20
			moved, err := r.Pick(key, loads)
			switch {
			case err != nil:
				t.Fatalf("%s: %v", info.Name, err)
			case info.Load && moved.Backend == d.Backend:
				t.Fatalf("%s (Load): key %d stays on backend %d with %d in flight", info.Name, key, d.Backend, loads.inflight[d.Backend])
			case info.Key && !info.Load && moved.Backend != d.Backend:
				t.Fatalf("%s (Key, not Load): key %d left backend %d for its load", info.Name, key, d.Backend)
			}
		}
	}
}

// TestReasonTable walks the reason table: every row is complete, its
// label is unique, safe as a metric label value and is what String gives.
func TestReasonTable(t *testing.T) {
	all := Reasons()
	if len(all) != int(NumReasons) {
		t.Fatalf("%d rows for %d reasons", len(all), NumReasons)
	}
	label := regexp.MustCompile(`^[a-z][a-z_]*[a-z]$`)
	seen := map[string]bool{}
	for i, info := range all {
		if info.Reason != Reason(i) {
			t.Errorf("row %d describes %d", i, info.Reason)
		}
		if !label.MatchString(info.Label) || info.Description == "" {
			t.Errorf("%d: incomplete row %+v (a label in lower case, a description)", i, info)
		}
		if seen[info.Label] || info.Label == "unknown" {
			t.Errorf("label %s used twice", info.Label)
		}
		seen[info.Label] = true
		if Reason(i).String() != info.Label {
			t.Errorf("%d: String %q, want %q", i, Reason(i), info.Label)
		}
	}
	if NumReasons.String() != "unknown" {
		t.Errorf("a reason past the table is %q", NumReasons)
	}
}

// Every key depth and overflow rule has a command level, and the zero
// values (omitted from the Raft log's JSON) are readable by every version.
func TestSettingLevels(t *testing.T) {
	for i := range keyDepthNames {
		if l := KeyDepth(i).Level(); l == 0 {
			t.Errorf("key depth %s has no level", KeyDepth(i))
		}
	}
	for i := range overflowNames {
		if l := OverflowRule(i).Level(); l == 0 {
			t.Errorf("overflow rule %s has no level", OverflowRule(i))
		}
	}
	if FixedDepth.Level() != 1 || ThresholdOverflow.Level() != 1 {
		t.Errorf("zero values at levels %d and %d, want 1", FixedDepth.Level(), ThresholdOverflow.Level())
	}
}
