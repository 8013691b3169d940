package node

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/node/admin"
)

// modelEngine answers /v1/models with models and chat completions.
func modelEngine(t *testing.T, models ...string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			var data []string
			for _, m := range models {
				data = append(data, fmt.Sprintf(`{"id":%q,"object":"model","owned_by":"vllm","root":%q,"parent":null}`, m, m))
			}
			fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(data, ","))
		case "/v1/chat/completions":
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, `{"object":"chat.completion"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestModelsLearnedAndAgreed: three clustered routers in front of a mixed
// fleet learn what each backend serves from its /v1/models (through the
// leader and Raft), route every request to a backend serving its model,
// agree on each one, and refuse a model nobody serves.
func TestModelsLearnedAndAgreed(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	serves := map[string][]string{}
	var urls []string
	for _, ms := range [][]string{{"llama"}, {"llama", "llama-sql"}, {"qwen"}, {"qwen"}} {
		srv := modelEngine(t, ms...)
		urls = append(urls, srv.URL)
		serves[strings.TrimPrefix(srv.URL, "http://")] = ms
	}
	nodes := startClusterRaft(t, 3, 300*time.Millisecond, func(i int, c *Config) { *c = testConfig(urls) })
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	testkit.WaitFor(t, 20*time.Second, "every router to know what every backend serves", func() bool {
		for _, n := range nodes {
			st, _ := n.agree.State()
			if !maps2Equal(servedModels(&st), serves) {
				return false
			}
			// Installed in the proxy too: a model nobody serves is refused.
			if _, err := send("http://"+n.TrafficAddr().String(), `{"model":"mistral","messages":[{"role":"user","content":"x"}]}`); err == nil || !strings.Contains(err.Error(), "404") {
				return false
			}
		}
		return true
	})
	for _, model := range []string{"llama", "qwen", "llama-sql"} {
		for i := 0; i < 20; i++ {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"question %d"}]}`, model, i)
			var first string
			for j, n := range nodes {
				b, err := send("http://"+n.TrafficAddr().String(), body)
				if err != nil {
					t.Fatalf("%s via router %d: %v", model, j, err)
				}
				if !slices.Contains(serves[b], model) {
					t.Fatalf("%s sent to %s, which serves %v", model, b, serves[b])
				}
				if j == 0 {
					first = b
				} else if b != first {
					t.Fatalf("%s: router %d sent to %s, router 0 to %s", model, j, b, first)
				}
			}
		}
	}
	resp, err := http.Post("http://"+nodes[1].TrafficAddr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"mistral","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "model_not_found") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
}

func maps2Equal(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestParseModels(t *testing.T) {
	got, err := parseModels([]byte(`{"object":"list","data":[{"id":"b"},{"id":"a","parent":"b"},{"id":"b"},{"id":""},{"id":"tab\there"}]}`))
	if err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{``, `{}`, `{"data":[]}`, `{"data":{"id":"a"}}`, `[1]`, `{"data":[{"id":""}]}`} {
		if _, err := parseModels([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	many := `{"data":[` + strings.Repeat(`{"id":"m"},`, maxBackendModels) + `{"id":"m"}]}`
	if _, err := parseModels([]byte(many)); err == nil {
		t.Error("more than maxBackendModels accepted")
	}
}

func FuzzParseModels(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model"},{"id":"sql-lora","parent":"meta-llama/Llama-3.1-8B-Instruct"}]}`))
	f.Add([]byte(`{"data":[{"id":"a"},{"id":"a"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := parseModels(b)
		if err != nil {
			return
		}
		if len(ms) == 0 || len(ms) > maxBackendModels || !slices.IsSorted(ms) || len(slices.Compact(slices.Clone(ms))) != len(ms) {
			t.Fatalf("models %q", ms)
		}
		for _, m := range ms {
			if m == "" || len(m) > maxModelID || !printableASCII(m) {
				t.Fatalf("model %q", m)
			}
		}
	})
}

// TestModelsDeclared: models declared in the config file seed the agreed
// backends, models given to the admin API's add-backend request reach the
// agreed backend, and lists out of bounds are refused up front.
func TestModelsDeclared(t *testing.T) {
	c := DefaultConfig()
	path := t.TempDir() + "/warmroute.yaml"
	yaml := "backends:\n  - url: http://10.0.0.1:8000\n    models: [llama, llama-sql]\n  - http://10.0.0.2:8000\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	seed, err := c.seedBackends()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seed[0].Models, []string{"llama", "llama-sql"}) || seed[1].Models != nil {
		t.Fatalf("seeded models %v, %v", seed[0].Models, seed[1].Models)
	}
	c.Backends[1].Models = []string{"tab\tm"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "model") {
		t.Fatalf("a bad declared model: %v", err)
	}

	b, err := ParseBackend(admin.BackendRequest{URL: "http://10.0.0.3:8000", Models: []string{"qwen"}})
	if err != nil || !slices.Equal(b.Models, []string{"qwen"}) {
		t.Fatalf("admin request: %+v %v", b, err)
	}
	if _, err := ParseBackend(admin.BackendRequest{URL: "http://10.0.0.3:8000", Models: []string{strings.Repeat("m", maxModelID+1)}}); err == nil {
		t.Fatal("an over-long model accepted")
	}
}

// TestModelsChurnBounded: a backend's first list commits at once; a
// change commits only once two polls in a row agree, and at most once per
// modelsCommitGap; a list that changes at every poll never commits again.
func TestModelsChurnBounded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var w modelWatch
	a, b, c := []string{"a"}, []string{"a", "b"}, []string{"c"}
	steps := []struct {
		agreed, got []string
		at          time.Duration
		want        modelsVerdict
	}{
		{nil, a, 0, modelsCommit}, // first knowledge
		{a, a, 10 * time.Second, modelsSame},
		{a, b, 20 * time.Second, modelsUnstable},
		{a, b, 30 * time.Second, modelsCommit}, // stable over two polls
		{b, c, 40 * time.Second, modelsUnstable},
		{b, c, 50 * time.Second, modelsRateLimited}, // stable, but 20 s after the last change
		{b, c, 80 * time.Second, modelsRateLimited},
		{b, c, 95 * time.Second, modelsCommit}, // a minute after it
		{c, c, 105 * time.Second, modelsSame},
		{c, a, 115 * time.Second, modelsUnstable},
		{c, c, 125 * time.Second, modelsSame}, // it flipped back: nothing to commit
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		got := w.consider(s.agreed, s.got, now)
		if got != s.want {
			t.Fatalf("step %d (%v -> %v at %v): verdict %d, want %d", i, s.agreed, s.got, s.at, got, s.want)
		}
		if got == modelsCommit && len(s.agreed) > 0 {
			w.committed = now // as considerModels does after a commit
		}
	}

	// Every poll a new list: after the first, nothing commits.
	var churn modelWatch
	agreed := []string(nil)
	commits := 0
	for i := range 100 {
		got := []string{fmt.Sprintf("m%d", i)}
		if churn.consider(agreed, got, t0.Add(time.Duration(i)*modelsPeriod)) == modelsCommit {
			commits++
			agreed = got
			churn.committed = t0.Add(time.Duration(i) * modelsPeriod)
		}
	}
	if commits != 1 {
		t.Errorf("a list that changes at every poll committed %d times in 100 polls, want 1 (its first)", commits)
	}
}

// TestParseModelsSizeBounded: a list whose ids total more than
// maxModelsBytes is refused, whatever the count.
func TestParseModelsSizeBounded(t *testing.T) {
	list := func(n, size int) []byte {
		var data []string
		for i := range n {
			id := fmt.Sprintf("%0*d", size, i)
			data = append(data, fmt.Sprintf(`{"id":%q}`, id))
		}
		return []byte(`{"data":[` + strings.Join(data, ",") + `]}`)
	}
	if ms, err := parseModels(list(256, 256)); err != nil || len(ms) != 256 {
		t.Fatalf("64 KiB of ids: %d %v", len(ms), err)
	}
	if _, err := parseModels(list(257, 256)); err == nil || !strings.Contains(err.Error(), "at most 65536") {
		t.Fatalf("over 64 KiB of ids: %v", err)
	}
}
