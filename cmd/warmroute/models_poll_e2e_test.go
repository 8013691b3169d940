package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// modelsBackend is an engine whose /v1/models answers what list returns
// (its call number, from 1), or status when status is not 0.
type modelsBackend struct {
	srv   *httptest.Server
	polls atomic.Int64
}

func newModelsBackend(t *testing.T, status int, list func(call int64) []string) *modelsBackend {
	b := &modelsBackend{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			n := b.polls.Add(1)
			if status != 0 {
				http.Error(w, "engine starting", status)
				return
			}
			var data []string
			for _, id := range list(n) {
				data = append(data, fmt.Sprintf(`{"id":%q,"object":"model"}`, id))
			}
			fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(data, ","))
		case "/v1/chat/completions":
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, `{"object":"chat.completion","choices":[{"message":{"content":"ok"}}]}`)
		}
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *modelsBackend) id() string { return strings.TrimPrefix(b.srv.URL, "http://") }

// ids returns n model ids of size bytes, distinct within a call and from
// one call to the next.
func ids(call int64, n, size int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%0*d", size, call*100_000+int64(i))
	}
	return out
}

// TestE2EModelListChurnBounded: a backend whose /v1/models changes at
// every poll cost a Raft commit (a ring build on every router) every 10 s,
// and failed polls were neither logged nor counted (before). Now its first
// list commits and the changing ones wait for a second identical answer,
// which never comes; a list over 64 KiB of ids is refused; failed polls
// are logged and counted per backend.
func TestE2EModelListChurnBounded(t *testing.T) {
	t.Parallel()
	needBinary(t)
	churn := newModelsBackend(t, 0, func(call int64) []string { return ids(call, 100, 100) })
	failing := newModelsBackend(t, http.StatusServiceUnavailable, nil)
	big := newModelsBackend(t, 0, func(int64) []string { return ids(0, 1024, 240) })
	r := startRouter(t, proc.ServeArgs{Backends: []string{churn.srv.URL, failing.srv.URL, big.srv.URL}})
	c := &http.Client{Timeout: 5 * time.Second}

	models := func(id string) ([]string, uint64) {
		var doc struct {
			Epoch    uint64 `json:"epoch"`
			Backends []struct {
				ID     string   `json:"id"`
				Models []string `json:"models"`
			} `json:"backends"`
		}
		if err := getJSON(c, r.admin+"/v1/backends", &doc); err != nil {
			t.Fatal(err)
		}
		for _, b := range doc.Backends {
			if b.ID == id {
				return b.Models, doc.Epoch
			}
		}
		return nil, doc.Epoch // not seeded yet
	}
	// The first answer is learned at once.
	var epoch uint64
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		var ms []string
		ms, epoch = models(churn.id())
		return len(ms) == 100, r.Alive()
	}); err != nil {
		t.Fatalf("the churning backend's first list was not learned: %v\n%s", err, r.Logs())
	}
	// Two more polls, each with a new list.
	if _, err := pollUntil(40*time.Second, func() (bool, error) { return churn.polls.Load() >= 3, r.Alive() }); err != nil {
		t.Fatal(err)
	}
	// The second and third answers considered and held (on a loaded
	// machine a poll's answer may take a while to be considered).
	held := func() float64 {
		v, _ := adminMetric(c, r.admin, `warmroute_models_changes_held_total{reason="unstable"}`)
		return v
	}
	if _, err := pollUntil(10*time.Second, func() (bool, error) { return held() >= 2, r.Alive() }); err != nil {
		t.Errorf("changes held as unstable: %v after %d polls, want at least 2", held(), churn.polls.Load())
	}
	ms, now := models(churn.id())
	if len(ms) != 100 || ms[0] != ids(1, 1, 100)[0] {
		t.Errorf("after %d polls of a list that changes every time: %d models (epoch %d -> %d); want the first list",
			churn.polls.Load(), len(ms), epoch, now)
	}
	if bms, _ := models(big.id()); len(bms) != 0 {
		t.Errorf("a list of 1,024 ids of 240 bytes (240 KiB) was committed")
	}

	met := func(name string) float64 {
		v, err := adminMetric(c, r.admin, name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		return v
	}
	if v := met(`warmroute_models_commits_total`); v != 1 {
		t.Errorf("warmroute_models_commits_total %v, want 1 (the churning backend's first list)", v)
	}
	for _, b := range []*modelsBackend{failing, big} {
		if v := met(fmt.Sprintf(`warmroute_models_poll_failures_total{backend=%q}`, b.id())); v < 2 {
			t.Errorf("failed polls of %s counted: %v, want at least 2", b.id(), v)
		}
	}
	logs := r.Logs()
	for _, want := range []struct{ backend, err string }{{failing.id(), "status 503"}, {big.id(), "at most 65536"}} {
		re := regexp.MustCompile(`(?m)^.*level=WARN msg="cannot learn what a backend serves.*backend=` + regexp.QuoteMeta(want.backend) + `.*$`)
		lines := re.FindAllString(logs, -1)
		if len(lines) != 1 || !strings.Contains(lines[0], want.err) {
			t.Errorf("want one warning (rate-limited) for %s naming %q, got %d:\n%s", want.backend, want.err, len(lines), strings.Join(lines, "\n"))
		}
	}
}
