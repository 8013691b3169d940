package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/ring"
)

func seeded(t *testing.T) State {
	t.Helper()
	s, changed, err := apply(&State{Backends: []Backend{}}, Seed(testSeed(), testRouting()))
	if err != nil || !changed {
		t.Fatalf("seed: changed=%v err=%v", changed, err)
	}
	return s
}

func mustApply(t *testing.T, s State, cmd Command) State {
	t.Helper()
	next, _, err := apply(&s, cmd)
	if err != nil {
		t.Fatalf("apply %+v: %v", cmd, err)
	}
	return next
}

func TestSeedAppliesOnce(t *testing.T) {
	s := seeded(t)
	if !s.Seeded || len(s.Backends) != 2 || s.Backends[0].Source != SourceConfig || s.Backends[0].State != StateActive {
		t.Fatalf("seeded state: %+v", s)
	}
	again, changed, err := apply(&s, Seed([]Backend{{ID: "x", URL: "http://x:1"}}, ring.DefaultSettings()))
	if err != nil || changed || len(again.Backends) != 2 {
		t.Fatalf("second seed changed the state: changed=%v err=%v %+v", changed, err, again)
	}
}

func TestCommandsBeforeSeedRejected(t *testing.T) {
	_, _, err := apply(&State{Backends: []Backend{}}, UpsertBackend(Backend{ID: "x", URL: "http://x:1"}))
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
}

func TestUpsertRemoveKeepsSortedAndDefaults(t *testing.T) {
	s := seeded(t)
	s = mustApply(t, s, UpsertBackend(Backend{ID: "gpu-0/", URL: "http://127.0.0.1:9000", Labels: map[string]string{"model": "llama"}}))
	if ids := []string{s.Backends[0].ID, s.Backends[1].ID, s.Backends[2].ID}; ids[0] != "gpu-0/" || ids[2] != "gpu-b/" {
		t.Fatalf("not sorted: %v", ids)
	}
	b, _ := s.Backend("gpu-0/")
	if b.Source != SourceAdmin || b.State != StateActive || b.Labels["model"] != "llama" {
		t.Fatalf("defaults: %+v", b)
	}
	// An upsert without a state keeps the current one.
	s = mustApply(t, s, SetBackendState("gpu-0/", "draining"))
	s = mustApply(t, s, UpsertBackend(Backend{ID: "gpu-0/", URL: "http://127.0.0.1:9100", Weight: 2}))
	b, _ = s.Backend("gpu-0/")
	if b.State != StateDraining || b.URL != "http://127.0.0.1:9100" || b.Weight != 2 || b.Labels != nil {
		t.Fatalf("upsert: %+v", b)
	}
	s = mustApply(t, s, RemoveBackend("gpu-0/"))
	if _, ok := s.Backend("gpu-0/"); ok || len(s.Backends) != 2 {
		t.Fatalf("remove: %+v", s.Backends)
	}
	if _, _, err := apply(&s, RemoveBackend("gpu-0/")); !errors.Is(err, ErrUnknownBackend) {
		t.Fatalf("second remove: %v", err)
	}
	if _, _, err := apply(&s, SetBackendState("nope", "down")); !errors.Is(err, ErrUnknownBackend) {
		t.Fatalf("state of unknown: %v", err)
	}
}

func TestIdenticalCommandDoesNotChange(t *testing.T) {
	s := seeded(t)
	_, changed, err := apply(&s, UpsertBackend(s.Backends[0]))
	if err != nil || changed {
		t.Fatalf("re-upserting the same backend: changed=%v err=%v", changed, err)
	}
	_, changed, err = apply(&s, SetRouting(s.Routing))
	if err != nil || changed {
		t.Fatalf("the same routing again: changed=%v err=%v", changed, err)
	}
}

func TestInvalidCommandsLeaveStateAlone(t *testing.T) {
	s := seeded(t)
	before := s.Clone()
	bad := []Command{
		UpsertBackend(Backend{ID: "", URL: "http://x:1"}),
		UpsertBackend(Backend{ID: "a b", URL: "http://x:1"}),
		UpsertBackend(Backend{ID: "x", URL: "ftp://x:1"}),
		UpsertBackend(Backend{ID: "x", URL: "http://x:1", Weight: 5000}),
		UpsertBackend(Backend{ID: "x", URL: "http://x:1", State: "sleeping"}),
		UpsertBackend(Backend{ID: "x", URL: "http://x:1", Source: "mystery"}),
		SetBackendState("gpu-a/", "gone"),
		SetRouting(ring.Settings{Strategy: ring.PrefixAware, PrefixLength: 10, ConcurrencyThreshold: 4, OverflowDepth: 4}),
		SetRouting(ring.Settings{Strategy: ring.Strategy(99), PrefixLength: 4096, ConcurrencyThreshold: 4, OverflowDepth: 4}),
		{Op: "explode"},
		{Op: OpUpsertBackend},
		{Op: OpSyncDiscovered, Backends: []Backend{{ID: "d", URL: "http://d:1"}, {ID: "d", URL: "http://d:1"}}},
	}
	for _, cmd := range bad {
		next, changed, err := apply(&s, cmd)
		if err == nil || changed || !next.equal(&before) {
			t.Errorf("%+v: err=%v changed=%v", cmd, err, changed)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: err %v is not ErrInvalid", cmd, err)
		}
	}
	if !s.equal(&before) {
		t.Fatal("apply mutated its input")
	}
}

func TestHealthNeverOverridesOperator(t *testing.T) {
	s := seeded(t)
	health := func(id, st string) Command { return Command{Op: OpSetBackendState, ID: id, State: st, By: ByHealth} }
	s = mustApply(t, s, health("gpu-a/", StateDown))
	if b, _ := s.Backend("gpu-a/"); b.State != StateDown || b.StateBy != ByHealth {
		t.Fatalf("health down: %+v", b)
	}
	s = mustApply(t, s, health("gpu-a/", StateActive))
	if b, _ := s.Backend("gpu-a/"); b.State != StateActive {
		t.Fatalf("health up: %+v", b)
	}
	// Operator drains; health can neither mark it down nor active.
	s = mustApply(t, s, SetBackendState("gpu-a/", StateDraining))
	for _, st := range []string{StateDown, StateActive} {
		s = mustApply(t, s, health("gpu-a/", st))
		if b, _ := s.Backend("gpu-a/"); b.State != StateDraining {
			t.Fatalf("health %s overrode draining: %+v", st, b)
		}
	}
	// Operator down; health up does not revive it.
	s = mustApply(t, s, SetBackendState("gpu-a/", StateDown))
	s = mustApply(t, s, health("gpu-a/", StateActive))
	if b, _ := s.Backend("gpu-a/"); b.State != StateDown || b.StateBy != ByAdmin {
		t.Fatalf("health revived an operator's down: %+v", b)
	}
}

func TestSyncDiscovered(t *testing.T) {
	s := seeded(t)
	// An admin backend with an ID DNS also returns stays the admin's.
	s = mustApply(t, s, UpsertBackend(Backend{ID: "10.0.0.9:8000", URL: "http://10.0.0.9:8000"}))
	sync := func(ids ...string) Command {
		var bs []Backend
		for _, id := range ids {
			bs = append(bs, Backend{ID: id, URL: "http://" + id})
		}
		return Command{Op: OpSyncDiscovered, Backends: bs}
	}
	s = mustApply(t, s, sync("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.9:8000"))
	if len(s.Backends) != 5 {
		t.Fatalf("backends: %+v", s.Backends)
	}
	if b, _ := s.Backend("10.0.0.9:8000"); b.Source != SourceAdmin {
		t.Fatalf("discovery took over an admin backend: %+v", b)
	}
	s = mustApply(t, s, Command{Op: OpSetBackendState, ID: "10.0.0.1:8000", State: StateDown, By: ByHealth})
	s = mustApply(t, s, sync("10.0.0.1:8000"))
	if _, ok := s.Backend("10.0.0.2:8000"); ok {
		t.Fatal("backend gone from DNS was kept")
	}
	if b, _ := s.Backend("10.0.0.1:8000"); b.State != StateDown {
		t.Fatalf("sync reset a discovered backend's state: %+v", b)
	}
	if _, ok := s.Backend("10.0.0.9:8000"); !ok {
		t.Fatal("sync removed an admin backend")
	}
	if _, ok := s.Backend("gpu-a/"); !ok {
		t.Fatal("sync removed a config backend")
	}
}

func TestRingBackendAndConfig(t *testing.T) {
	s := seeded(t)
	s = mustApply(t, s, SetBackendState("gpu-b/", StateDraining))
	rb := s.RingBackends()
	if rb[1].ID != "gpu-b/" || rb[1].State.String() != StateDraining || rb[0].Zone != "z1" {
		t.Fatalf("ring backends: %+v", rb)
	}
	if err := s.Routing.Validate(); err != nil || s.Routing.PrefixLength != 2048 {
		t.Fatalf("routing: %+v %v", s.Routing, err)
	}
}

// FuzzApply feeds arbitrary log entries to the state machine: it must never
// panic, and whatever it accepts must leave a valid, sorted state that
// survives a snapshot round trip.
func FuzzApply(f *testing.F) {
	for _, cmd := range []Command{
		Seed(testSeed(), testRouting()),
		UpsertBackend(Backend{ID: "x", URL: "http://x:1", Labels: map[string]string{"a": "b"}}),
		RemoveBackend("gpu-a/"),
		SetBackendState("gpu-b/", "draining"),
		{Op: OpSetBackendState, ID: "gpu-a/", State: "down", By: ByHealth},
		SetRouting(ring.DefaultSettings()),
		{Op: OpSyncDiscovered, Backends: []Backend{{ID: "d:1", URL: "http://d:1"}}},
		SetClusterID("0123456789abcdef0123456789abcdef"),
		Revoke([]string{"r2"}, []string{"0A:1b"}),
		Unrevoke([]string{"r2"}, nil),
		SetRecomputeUnit(2048),
	} {
		b, _ := json.Marshal(cmd) // as written before checksums
		f.Add(b)
		b, _ = encodeCommand(cmd)
		f.Add(b)
	}
	f.Add([]byte(`{"op":"seed"}`))
	f.Add([]byte(`{"op":"upsert_backend","backend":{"id":"\u0000","url":"http://[::1]:0"}}`))
	f.Add([]byte(`{"sum":"0000000000000000","op":"seed"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, base := range []State{{Backends: []Backend{}}, seeded(t)} {
			cmd, err := decodeCommand(data)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("decode error %v is not ErrCorrupt", err)
				}
				continue
			}
			// What decodes encodes back to an entry that decodes to it.
			again, err := encodeCommand(cmd)
			if err != nil {
				t.Fatal(err)
			}
			if back, err := decodeCommand(again); err != nil || !reflect.DeepEqual(back, cmd) {
				t.Fatalf("re-encoded entry: %v\n%+v\n%+v", err, back, cmd)
			}
			next, changed, err := apply(&base, cmd)
			if err != nil {
				if changed || !next.equal(&base) {
					t.Fatal("a rejected command changed the state")
				}
				continue
			}
			if err := next.validate(); err != nil {
				t.Fatalf("accepted a command that leaves an invalid state: %v", err)
			}
			b, err := json.Marshal(snapshotFile{Version: snapshotVersion, State: next})
			if err != nil {
				t.Fatal(err)
			}
			var back snapshotFile
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.State.Backends == nil {
				back.State.Backends = []Backend{}
			}
			if !back.State.equal(&next) {
				t.Fatalf("snapshot round trip changed the state:\n%+v\n%+v", next, back.State)
			}
		}
	})
}

func TestSeedSortsBackends(t *testing.T) {
	st, changed, err := apply(&State{}, Seed([]Backend{
		{ID: "c", URL: "http://c:1"}, {ID: "a", URL: "http://a:1"}, {ID: "b", URL: "http://b:1"},
	}, ring.DefaultSettings()))
	if err != nil || !changed {
		t.Fatalf("seed in any order: %v", err)
	}
	if err := st.validate(); err != nil {
		t.Fatal(err)
	}
	if st.Backends[0].ID != "a" || st.Backends[2].ID != "c" {
		t.Fatalf("backends not sorted: %+v", st.Backends)
	}
	if _, _, err := apply(&State{}, Seed([]Backend{{ID: "a", URL: "http://a:1"}, {ID: "a", URL: "http://a:2"}}, ring.DefaultSettings())); err == nil {
		t.Fatal("a seed with a duplicate ID was accepted")
	}
}

// TestEntryChecksum: any one byte changed in an entry fails it, and an
// entry written before checksums decodes as it did.
func TestEntryChecksum(t *testing.T) {
	cmd := UpsertBackend(Backend{ID: "gpu-z/", URL: "http://127.0.0.1:9009", Zone: "z1", Labels: map[string]string{"a": "b"}})
	data, err := encodeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := decodeCommand(data); err != nil || !reflect.DeepEqual(got, cmd) {
		t.Fatalf("round trip: %v %+v", err, got)
	}
	for i := range data {
		for _, delta := range []byte{1, 0x20} {
			bad := append([]byte(nil), data...)
			bad[i] ^= delta
			if _, err := decodeCommand(bad); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d xor %#x (%q): %v, want ErrCorrupt", i, delta, bad, err)
			}
		}
	}
	legacy, _ := json.Marshal(cmd)
	if got, err := decodeCommand(legacy); err != nil || !reflect.DeepEqual(got, cmd) {
		t.Fatalf("an entry written before checksums: %v %+v", err, got)
	}
	if _, err := decodeCommand([]byte(`{"op":"reticulate"}`)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an unknown op: %v, want ErrCorrupt (a newer version's entry halts this one)", err)
	}
}

// TestSetModels: set_models records a backend's models sorted and without
// repeats, refuses unknown backends and lists out of bounds, clears with
// an empty list, and an upsert without models keeps them.
func TestSetModels(t *testing.T) {
	st := State{}
	st, _, err := apply(&st, Seed([]Backend{{ID: "a", URL: "http://a:1"}, {ID: "b", URL: "http://b:1"}}, ring.DefaultSettings()))
	if err != nil {
		t.Fatal(err)
	}
	next, changed, err := apply(&st, SetModels("a", []string{"qwen", "llama", "qwen"}))
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	if a, _ := next.Backend("a"); !slices.Equal(a.Models, []string{"llama", "qwen"}) {
		t.Fatalf("models %v", a.Models)
	}
	if b, _ := st.Backend("a"); b.Models != nil {
		t.Fatal("the command changed the state it was applied to")
	}
	if _, changed, err := apply(&next, SetModels("a", []string{"llama", "qwen"})); err != nil || changed {
		t.Fatalf("the same models: changed %v, %v", changed, err)
	}
	up, _, err := apply(&next, UpsertBackend(Backend{ID: "a", URL: "http://a:2"}))
	if a, _ := up.Backend("a"); err != nil || !slices.Equal(a.Models, []string{"llama", "qwen"}) {
		t.Fatalf("after an upsert without models: %v %v", a.Models, err)
	}
	cleared, _, err := apply(&next, SetModels("a", nil))
	if a, _ := cleared.Backend("a"); err != nil || a.Models != nil {
		t.Fatalf("cleared: %v %v", a.Models, err)
	}
	if _, _, err := apply(&next, SetModels("zz", []string{"m"})); !errors.Is(err, ErrUnknownBackend) {
		t.Fatalf("unknown backend: %v", err)
	}
	many := make([]string, maxModels+1)
	for i := range many {
		many[i] = fmt.Sprintf("m%d", i)
	}
	for _, bad := range [][]string{many, {""}, {strings.Repeat("x", maxModelLen+1)}, {"tab\tm"}} {
		if _, _, err := apply(&next, SetModels("a", bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%d models, first %.20q: %v", len(bad), bad[0], err)
		}
	}
	if c := SetModels("a", []string{"m"}); c.level() != 2 {
		t.Fatalf("set_models at level %d", c.level())
	}
}

// TestRevocationList: revoke and unrevoke keep the list sorted, canonical
// and without repeats; a repeat changes nothing; bad names and serial
// numbers are refused; the commands need level 3 (a router of level 2
// would halt on them).
func TestRevocationList(t *testing.T) {
	s := seeded(t)
	s = mustApply(t, s, Revoke([]string{"r3", "r1", "r3"}, []string{"0x00AB:CD", "1"}))
	if !slices.Equal(s.RevokedNames, []string{"r1", "r3"}) || !slices.Equal(s.RevokedSerials, []string{"1", "abcd"}) {
		t.Fatalf("list %v %v", s.RevokedNames, s.RevokedSerials)
	}
	if !s.Revoked("r1") || s.Revoked("r2") {
		t.Fatal("Revoked disagrees with the list")
	}
	if _, changed, err := apply(&s, Revoke([]string{"r1"}, []string{"AB:CD"})); err != nil || changed {
		t.Fatalf("revoking again: changed=%v err=%v", changed, err)
	}
	c := s.Clone()
	c.RevokedNames[0] = "zz"
	if s.RevokedNames[0] != "r1" {
		t.Fatal("Clone shares the revocation list")
	}
	for _, bad := range []Command{
		Revoke(nil, nil),
		Revoke([]string{"bad name"}, nil),
		Revoke([]string{""}, nil),
		Revoke(nil, []string{"xyz"}),
		Revoke(nil, []string{strings.Repeat("f", 41)}),
		Unrevoke(nil, nil),
	} {
		if next, changed, err := apply(&s, bad); !errors.Is(err, ErrInvalid) || changed || !next.equal(&s) {
			t.Errorf("%+v: changed=%v err=%v, want ErrInvalid and no change", bad, changed, err)
		}
	}
	s = mustApply(t, s, Unrevoke([]string{"r1", "r9"}, []string{"abcd"}))
	if !slices.Equal(s.RevokedNames, []string{"r3"}) || !slices.Equal(s.RevokedSerials, []string{"1"}) {
		t.Fatalf("after unrevoke: %v %v", s.RevokedNames, s.RevokedSerials)
	}
	s = mustApply(t, s, Unrevoke([]string{"r3"}, []string{"1"}))
	if s.RevokedNames != nil || s.RevokedSerials != nil {
		t.Fatalf("an empty list is nil, got %#v %#v", s.RevokedNames, s.RevokedSerials)
	}
	for _, cmd := range []Command{Revoke([]string{"r1"}, nil), Unrevoke([]string{"r1"}, nil)} {
		if cmd.level() != 3 {
			t.Errorf("%s: level %d, want 3", cmd.Op, cmd.level())
		}
	}
	if CommandLevel < 3 {
		t.Fatalf("CommandLevel %d does not cover revocations", CommandLevel)
	}
	// A state with an unsorted or non-canonical list is invalid.
	for _, st := range []State{{RevokedNames: []string{"b", "a"}}, {RevokedSerials: []string{"0a"}}, {RevokedSerials: []string{"AB"}}} {
		st.Backends = []Backend{}
		if err := st.validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", st, err)
		}
	}
}

// TestSetRecomputeUnit: the agreed unit is set, a repeat changes nothing,
// 0 clears it, a unit out of range is refused (and a state holding one is
// invalid), and the command needs level 4.
func TestSetRecomputeUnit(t *testing.T) {
	st := seeded(t)
	next, changed, err := apply(&st, SetRecomputeUnit(1500))
	if err != nil || !changed || next.RecomputeUnit != 1500 || st.RecomputeUnit != 0 {
		t.Fatalf("set: %d (was %d), changed %v, %v", next.RecomputeUnit, st.RecomputeUnit, changed, err)
	}
	if _, changed, err := apply(&next, SetRecomputeUnit(1500)); err != nil || changed {
		t.Fatalf("the same unit: changed %v, %v", changed, err)
	}
	if cleared, changed, err := apply(&next, SetRecomputeUnit(0)); err != nil || !changed || cleared.RecomputeUnit != 0 {
		t.Fatalf("cleared: %d, changed %v, %v", cleared.RecomputeUnit, changed, err)
	}
	for _, bad := range []int64{-1, MaxRecomputeUnit + 1} {
		if _, _, err := apply(&next, SetRecomputeUnit(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("unit %d: %v", bad, err)
		}
		s := next.Clone()
		s.RecomputeUnit = bad
		if err := s.validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("a state with unit %d: %v", bad, err)
		}
	}
	if _, _, err := apply(&State{}, SetRecomputeUnit(5)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("before the seed: %v", err)
	}
	if c := SetRecomputeUnit(5); c.level() != 4 {
		t.Fatalf("set_recompute_unit at level %d", c.level())
	}
}
