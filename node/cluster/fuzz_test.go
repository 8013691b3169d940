package cluster

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// FuzzRestore feeds arbitrary bytes to the two readers of a state
// snapshot: Raft's Restore (a snapshot from disk or sent by the leader)
// and the state cache file. Neither may panic; a rejected snapshot leaves
// the state machine as it was; an accepted one is a valid state that both
// readers agree on and that writes back and restores to itself.
func FuzzRestore(f *testing.F) {
	st, _, err := apply(&State{Backends: []Backend{}}, Seed(testSeed(), testRouting()))
	if err != nil {
		f.Fatal(err)
	}
	lab := st.Clone()
	lab.Backends[0].Labels = map[string]string{"gpu": "h100"}
	lab.Backends[1].State, lab.Backends[1].StateBy = StateDraining, ByHealth
	for _, sf := range []snapshotFile{
		{Version: snapshotVersion, Epoch: 7, State: st},
		{Version: snapshotVersion, Epoch: 1 << 40, State: lab},
		{Version: snapshotVersion, State: State{Backends: []Backend{}}},
		{Version: 2, Epoch: 3, State: st},
	} {
		b, err := json.Marshal(sf)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "null", "{}", `{"version":1}`, `{"version":1,"state":{"backends":null}}`,
		`{"version":1,"state":{"backends":[{"id":"b","url":"http://b:1","state":"active","source":"config"},{"id":"a","url":"http://a:1","state":"active","source":"config"}]}}`,
		`{"version":1,"state":{"seeded":true,"routing":{"strategy":"NOPE"}}}`,
		`{"version":1,"state":{"backends":[{"id":"a","url":"http://a:1","state":"down","state_by":"health","source":"dns","labels":{}}]}}`,
		`{"version":1,"state":{"seeded":true,"routing":{"strategy":"least-outstanding","prefix_length":2048,"concurrency_threshold":4,"overflow_depth":2}}}`,
		`{"version":1,"epoch":-1}`, `{"version":1} {"version":2}`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		before := &published{state: State{Backends: []Backend{{ID: "old", URL: "http://old:1", State: StateActive, Source: SourceConfig}}}, epoch: 3}
		notified := 0
		fm := newFSM(func() { notified++ }, nil, nil)
		fm.set(before)
		notified = 0
		err := fm.Restore(io.NopCloser(bytes.NewReader(b)))

		path := filepath.Join(dir, stateCacheFile)
		if werr := os.WriteFile(path, b, 0o600); werr != nil {
			t.Fatal(werr)
		}
		cached, cerr := stateCache{path: path}.load()

		if err != nil {
			if fm.load() != before || fm.view() != before || notified != 0 {
				t.Fatalf("rejected snapshot %q (%v) changed the state machine", b, err)
			}
			if cerr == nil {
				t.Fatalf("Restore rejects %q (%v), the state cache loads it", b, err)
			}
			return
		}
		p := fm.load()
		if fm.view() != p || notified != 1 {
			t.Fatalf("restored state not published (notified %d times)", notified)
		}
		if p.state.Backends == nil {
			t.Fatal("restored state has nil backends")
		}
		if err := p.state.validate(); err != nil {
			t.Fatalf("Restore accepted %q, an invalid state: %v", b, err)
		}
		// The form apply keeps: empty labels nil, the canonical strategy.
		for _, bk := range p.state.Backends {
			if bk.Labels != nil && len(bk.Labels) == 0 {
				t.Fatalf("Restore of %q kept empty labels of %s", b, bk.ID)
			}
		}
		// Restore reads one JSON value from a stream; the cache file must
		// hold exactly one, so it may refuse what Restore takes, but never
		// disagree on what both take.
		if cerr == nil && (cached.epoch != p.epoch || !cached.state.equal(&p.state)) {
			t.Fatalf("%q: Restore gives %+v, the state cache %+v", b, p, cached)
		}
		out, err := json.Marshal(snapshotFile{Version: snapshotVersion, Epoch: p.epoch, State: p.state})
		if err != nil {
			t.Fatal(err)
		}
		again := newFSM(func() {}, nil, nil)
		if err := again.Restore(io.NopCloser(bytes.NewReader(out))); err != nil {
			t.Fatalf("restored %q, wrote %q, which does not restore: %v", b, out, err)
		}
		if q := again.load(); q.epoch != p.epoch || !q.state.equal(&p.state) {
			t.Fatalf("snapshot round trip changed the state:\n%+v\n%+v", p, q)
		}
	})
}

// Found by FuzzRestore: a snapshot or cache file with empty labels or a
// strategy under another accepted name was kept as read, so the state
// differed from the one apply builds (empty labels nil, canonical names)
// and changed form on the next snapshot.
func TestRestoreNormalizes(t *testing.T) {
	b := []byte(`{"version":1,"epoch":4,"state":{"seeded":true,` +
		`"routing":{"strategy":"least-outstanding","prefix_length":2048,"concurrency_threshold":4,"overflow_depth":2},` +
		`"backends":[{"id":"a","url":"http://a:1","state":"active","source":"config","labels":{}}]}}`)
	fm := newFSM(func() {}, nil, nil)
	if err := fm.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), stateCacheFile)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cached, err := stateCache{path: path}.load()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []State{fm.load().state, cached.state} {
		if s.Backends[0].Labels != nil || s.Routing.Strategy != ring.LeastOutstanding {
			t.Fatalf("labels %#v, strategy %v: want nil and LEAST_OUTSTANDING_REQUESTS", s.Backends[0].Labels, s.Routing.Strategy)
		}
	}
}
