package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/node/cluster"
)

// What each backend serves. The Raft leader asks every backend for its
// /v1/models (vLLM, SGLang and TGI answer it; a LoRA adapter is a model of
// its own) and commits what changed (set_models), so every router builds
// the same per-model rings at the same epoch (proxy.SetModels). A backend
// that does not answer keeps what was known of it; one never heard from is
// unknown and takes any model.
//
// Every commit is a Raft entry written on every router's disk and a ring
// build on each, so the churn a backend can cause is bounded: its first
// list commits at once, a change only once two polls in a row gave the
// same list and at most once per modelsCommitGap, and a list whose ids
// total more than maxModelsBytes is refused. A failed poll is counted and
// logged (a warning when a backend starts failing, then every
// modelsWarnEvery while it fails).
const (
	// modelsPeriod is how often the leader asks.
	modelsPeriod = 10 * time.Second
	// modelsFirst is how soon after it starts the leader asks first.
	modelsFirst = time.Second
	// modelsTimeout bounds one backend's answer.
	modelsTimeout = 2 * time.Second
	// maxModelsBody bounds an answer (1,024 models of 256-byte ids with
	// vLLM's other fields fit well inside).
	maxModelsBody = 1 << 20
	// modelsParallel bounds the backends asked at once.
	modelsParallel = 8
	// maxBackendModels bounds the models kept of one backend (the agreed
	// state's bound).
	maxBackendModels = 1024
	maxModelID       = 256
	// maxModelsBytes bounds the ids of one backend's list, summed: a
	// set_models entry stays under about 70 KB (the agreed state's own
	// bounds allow 1,024 ids of 256 bytes, 256 KiB).
	maxModelsBytes = 64 << 10
	// modelsCommitGap is the least time between two changes committed
	// for one backend.
	modelsCommitGap = time.Minute
	// modelsWarnEvery is how often a backend whose polls keep failing is
	// warned about again.
	modelsWarnEvery = 5 * time.Minute
)

// modelWatch is what the leader remembers of one backend between polls
// (learnModels' goroutine only).
type modelWatch struct {
	last      []string  // the last list it answered, nil before one
	committed time.Time // when a change of its list was last committed
	failing   int       // polls failed in a row
	warned    time.Time // the last warning of this run of failures
}

// modelsVerdict is what the leader does with a backend's answer.
type modelsVerdict int

const (
	modelsSame        modelsVerdict = iota // the agreed list: nothing to do
	modelsCommit                           // commit it
	modelsUnstable                         // changed since the last poll: wait for the next
	modelsRateLimited                      // stable, but the last change was committed under modelsCommitGap ago
)

// consider decides on got, a backend's answer at now, against agreed,
// the list committed for it, and remembers got.
func (w *modelWatch) consider(agreed, got []string, now time.Time) modelsVerdict {
	prev := w.last
	w.last = got
	switch {
	case slices.Equal(got, agreed):
		return modelsSame
	case len(agreed) == 0:
		// Never known: the backend takes any model until this commits.
		return modelsCommit
	case !slices.Equal(got, prev):
		return modelsUnstable
	case !w.committed.IsZero() && now.Sub(w.committed) < modelsCommitGap:
		return modelsRateLimited
	}
	return modelsCommit
}

// modelsMetrics count the leader's polls and commits of backends' models.
type modelsMetrics struct {
	failures *prometheus.CounterVec // by backend
	held     *prometheus.CounterVec // by reason
	commits  prometheus.Counter
}

func newModelsMetrics(reg prometheus.Registerer) *modelsMetrics {
	m := &modelsMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "models",
			Name: "poll_failures_total", Help: "Polls of a backend's /v1/models that failed (unreachable, an error status, an answer refused), on the Raft leader, by backend."}, []string{"backend"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "models",
			Name: "changes_held_total", Help: "Changed model lists the Raft leader did not commit, by reason: unstable (it changed again since the last poll) or rate_limited (the backend's last change was committed under a minute ago)."}, []string{"reason"}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "models",
			Name: "commits_total", Help: "Model lists the Raft leader committed (set_models)."}),
	}
	reg.MustRegister(m.failures, m.held, m.commits)
	return m
}

// errRedirected: a backend's /v1/models answered with a redirect, which is
// not followed (it could point anywhere).
var errRedirected = errors.New("redirect not followed")

// learnModels asks the backends what they serve every modelsPeriod while
// this router leads, until ctx ends, and commits the changes.
func (n *Node) learnModels(ctx context.Context) {
	client := &http.Client{
		Transport: &http.Transport{
			Proxy:       nil,
			DialContext: (&net.Dialer{Timeout: modelsTimeout}).DialContext,
			// One question per backend every 10 s: a connection each time,
			// rather than one idle connection (and its goroutines) held
			// open per backend.
			DisableKeepAlives:      true,
			ResponseHeaderTimeout:  modelsTimeout,
			MaxResponseHeaderBytes: 64 << 10,
		},
		Timeout:       modelsTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirected },
	}
	t := time.NewTimer(modelsFirst)
	defer t.Stop()
	// watch starts afresh with every leadership.
	var watch map[string]*modelWatch
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(modelsPeriod)
		if !n.agree.IsLeader() {
			watch = nil
			continue
		}
		st, _ := n.agree.State()
		if !st.Seeded {
			continue
		}
		if watch == nil {
			watch = map[string]*modelWatch{}
		}
		got := pollModels(ctx, client, st.Backends)
		if ctx.Err() != nil {
			return
		}
		n.considerModels(ctx, st.Backends, got, watch, time.Now())
	}
}

// considerModels acts on a round of answers: counts and logs failures,
// commits the lists that consider lets through, and forgets backends no
// longer agreed.
func (n *Node) considerModels(ctx context.Context, backends []cluster.Backend, got map[string]modelsAnswer, watch map[string]*modelWatch, now time.Time) {
	ids := map[string]bool{}
	for _, b := range backends {
		ids[b.ID] = true
		a, ok := got[b.ID]
		if !ok {
			continue // not asked (not active)
		}
		w := watch[b.ID]
		if w == nil {
			w = &modelWatch{}
			watch[b.ID] = w
		}
		if a.err != nil {
			n.modelsMet.failures.WithLabelValues(b.ID).Inc()
			w.failing++
			if w.failing == 1 || now.Sub(w.warned) >= modelsWarnEvery {
				w.warned = now
				n.log.Warn("cannot learn what a backend serves; it keeps the models known of it", "backend", b.ID,
					"failed_polls", w.failing, "err", a.err)
			}
			continue
		}
		if w.failing > 0 {
			n.log.Info("a backend's models answer again", "backend", b.ID, "after_failed_polls", w.failing)
			w.failing, w.warned = 0, time.Time{}
		}
		switch w.consider(b.Models, a.models, now) {
		case modelsSame:
			continue
		case modelsUnstable:
			n.modelsMet.held.WithLabelValues("unstable").Inc()
			n.log.Debug("a backend's models changed; committed once the next poll gives the same list", "backend", b.ID, "models", len(a.models))
			continue
		case modelsRateLimited:
			n.modelsMet.held.WithLabelValues("rate_limited").Inc()
			n.log.Debug("a backend's models changed again within a minute; held", "backend", b.ID)
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.agree.Apply(actx, cluster.SetModels(b.ID, a.models))
		cancel()
		switch {
		case err == nil:
			n.modelsMet.commits.Inc()
			if len(b.Models) > 0 {
				w.committed = now
			}
			n.log.Info("backend models changed", "backend", b.ID, "models", len(a.models), "was", len(b.Models))
		case ctx.Err() == nil:
			n.log.Debug("committing a backend's models", "backend", b.ID, "err", err)
		}
	}
	for id := range watch {
		if !ids[id] {
			delete(watch, id)
			n.modelsMet.failures.DeleteLabelValues(id)
		}
	}
}

// modelsAnswer is one backend's answer: its models, or why there are
// none.
type modelsAnswer struct {
	models []string
	err    error
}

// pollModels asks every active backend for its models, modelsParallel at
// a time, and returns the answers by backend id.
func pollModels(ctx context.Context, client *http.Client, backends []cluster.Backend) map[string]modelsAnswer {
	var (
		mu   sync.Mutex
		out  = map[string]modelsAnswer{}
		wg   sync.WaitGroup
		sema = make(chan struct{}, modelsParallel)
	)
	for _, b := range backends {
		if b.State != cluster.StateActive {
			continue
		}
		select {
		case sema <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return out
		}
		wg.Add(1)
		go func() {
			defer func() { <-sema; wg.Done() }()
			ms, err := fetchModels(ctx, client, strings.TrimSuffix(b.URL, "/")+"/v1/models")
			mu.Lock()
			out[b.ID] = modelsAnswer{models: ms, err: err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// fetchModels GETs url and parses the answer.
func fetchModels(ctx context.Context, client *http.Client, url string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, modelsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxModelsBody {
		return nil, fmt.Errorf("%s: answer over %d bytes", url, maxModelsBody)
	}
	return parseModels(body)
}

// parseModels reads the model ids of a /v1/models answer
// ({"data":[{"id":...},...]}): sorted, without repeats, ids that are
// empty, longer than maxModelID or not printable ASCII left out. More
// than maxBackendModels models is an error, as is an answer with none.
func parseModels(body []byte) ([]string, error) {
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("models answer: %w", err)
	}
	if len(v.Data) > maxBackendModels {
		return nil, fmt.Errorf("models answer lists %d models, at most %d", len(v.Data), maxBackendModels)
	}
	set := map[string]bool{}
	for _, d := range v.Data {
		if d.ID != "" && len(d.ID) <= maxModelID && printableASCII(d.ID) {
			set[d.ID] = true
		}
	}
	if len(set) == 0 {
		return nil, errors.New("models answer lists no usable model")
	}
	total := 0
	for id := range set {
		total += len(id)
	}
	if total > maxModelsBytes {
		return nil, fmt.Errorf("models answer: ids of %d bytes in all, at most %d", total, maxModelsBytes)
	}
	return slices.Sorted(maps.Keys(set)), nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// servedModels is what the agreed backends serve, for proxy.SetModels.
func servedModels(st *cluster.State) map[string][]string {
	out := map[string][]string{}
	for _, b := range st.Backends {
		if len(b.Models) > 0 {
			out[b.ID] = b.Models
		}
	}
	return out
}
