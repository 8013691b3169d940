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

	"github.com/warmroute/warmroute/node/cluster"
)

// What each backend serves. The Raft leader asks every backend for its
// /v1/models (vLLM, SGLang and TGI answer it; a LoRA adapter is a model of
// its own) and commits what changed (set_models), so every router builds
// the same per-model rings at the same epoch (proxy.SetModels). A backend
// that does not answer keeps what was known of it; one never heard from is
// unknown and takes any model.
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
)

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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(modelsPeriod)
		if !n.agree.IsLeader() {
			continue
		}
		st, _ := n.agree.State()
		if !st.Seeded {
			continue
		}
		got := pollModels(ctx, client, st.Backends)
		for _, b := range st.Backends {
			ms, ok := got[b.ID]
			if !ok || slices.Equal(ms, b.Models) {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := n.agree.Apply(actx, cluster.SetModels(b.ID, ms))
			cancel()
			switch {
			case err == nil:
				n.log.Info("backend models changed", "backend", b.ID, "models", len(ms), "was", len(b.Models))
			case ctx.Err() == nil:
				n.log.Debug("committing a backend's models", "backend", b.ID, "err", err)
			}
		}
	}
}

// pollModels asks every active backend for its models, modelsParallel at
// a time, and returns those that answered, by backend id.
func pollModels(ctx context.Context, client *http.Client, backends []cluster.Backend) map[string][]string {
	var (
		mu   sync.Mutex
		out  = map[string][]string{}
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
			if err != nil {
				return
			}
			mu.Lock()
			out[b.ID] = ms
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
