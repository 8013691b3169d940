package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/agree"
)

// explainPath is the route explainer for chat requests.
const explainPath = "/debug/route/v1/chat/completions"

// probePrompts builds n chat bodies with distinct prompts (each its own
// routing key) for model.
func probePrompts(n int, model string, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 0x70726f6265))
	words := []string{"amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor",
		"indigo", "juniper", "kelp", "lumen", "maple", "nectar", "onyx", "pepper"}
	out := make([][]byte, n)
	for i := range out {
		var text bytes.Buffer
		fmt.Fprintf(&text, "chaos probe %d:", i)
		for j := 0; j < 12; j++ {
			text.WriteByte(' ')
			text.WriteString(words[rng.IntN(len(words))])
		}
		body := map[string]any{
			"messages":   []map[string]string{{"role": "user", "content": text.String()}},
			"max_tokens": 1,
		}
		if model != "" {
			body["model"] = model
		}
		out[i], _ = json.Marshal(body)
	}
	return out
}

// adminClient is an HTTP client for admin APIs with a bearer token, over
// HTTPS when the routers run cluster TLS.
type adminClient struct {
	hc    *http.Client
	token string
}

func newAdminClient(access AdminAccess, conns int) *adminClient {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		TLSClientConfig:     access.TLS,
		TLSHandshakeTimeout: time.Second,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
	}
	return &adminClient{hc: &http.Client{Transport: tr}, token: access.Token}
}

func (c *adminClient) close() { c.hc.CloseIdleConnections() }

// do sends a request and decodes a JSON answer into out (when not nil).
// Non-2xx answers are errors carrying the body.
func (c *adminClient) do(ctx context.Context, method, url string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, url, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// owner is e's load-blind choice, NoPick when no candidate is active and
// healthy in the router's view.
func owner(e agree.Explanation) string {
	if o := e.Owner(); o != "" {
		return o
	}
	return NoPick
}

// describe is a short form of the pick for disagreement samples.
func describe(e agree.Explanation) string {
	if e.Reason == "overflow" {
		return fmt.Sprintf("%s (overflow rank %d)", e.Backend, e.Rank)
	}
	return fmt.Sprintf("%s (%s)", e.Backend, e.Reason)
}

// prober samples the routers' explainers.
type prober struct {
	cfg     *Config
	routers []Router
	prompts [][]byte
	admin   *adminClient
	t0      time.Time

	mu    sync.Mutex
	ticks []Tick
}

func newProber(cfg *Config, routers []Router, prompts [][]byte, access AdminAccess, t0 time.Time) *prober {
	return &prober{cfg: cfg, routers: routers, prompts: prompts, admin: newAdminClient(access, 16), t0: t0}
}

// Ticks returns a copy of the samples so far.
func (p *prober) Ticks() []Tick {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Tick(nil), p.ticks...)
}

// Run samples every ProbeInterval until ctx ends.
func (p *prober) Run(ctx context.Context) {
	defer p.admin.close()
	t := time.NewTicker(p.cfg.ProbeInterval)
	defer t.Stop()
	for i := 0; ; i++ {
		tk := p.tick(ctx, i)
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		p.ticks = append(p.ticks, tk)
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// explain asks one router where body would go.
func (p *prober) explain(ctx context.Context, r Router, body []byte) (agree.Explanation, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ProbeTimeout)
	defer cancel()
	var e agree.Explanation
	err := p.admin.do(ctx, http.MethodPost, r.AdminURL+explainPath, body, &e)
	if err == nil && e.Backend == "" {
		e.Backend = NoPick
	}
	return e, err
}

// tick sends batch i of the prompts to every router at once.
func (p *prober) tick(ctx context.Context, i int) Tick {
	n, b := len(p.prompts), p.cfg.ProbeBatch
	idx := make([]int, b)
	for j := range idx {
		idx[j] = (i*b + j) % n
	}
	picks := make([][]string, len(p.routers))
	owners := make([][]string, len(p.routers))
	said := make([][]string, len(p.routers))
	epochs := make([]uint64, len(p.routers))
	answered := make([]bool, len(p.routers))
	var wg sync.WaitGroup
	for r := range p.routers {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			picks[r], owners[r], said[r] = make([]string, b), make([]string, b), make([]string, b)
			for j, k := range idx {
				e, err := p.explain(ctx, p.routers[r], p.prompts[k])
				if err != nil {
					if ctx.Err() != nil || isTimeoutOrRefused(err) {
						return // down, paused or unreachable: skip the rest of its batch
					}
					continue
				}
				picks[r][j], owners[r][j], said[r][j] = e.Backend, owner(e), describe(e)
				epochs[r] = max(epochs[r], e.Epoch)
				answered[r] = true
			}
		}(r)
	}
	wg.Wait()
	tk := Tick{At: time.Since(p.t0)}
	for r := range p.routers {
		if answered[r] {
			tk.Answering++
			tk.Epochs = append(tk.Epochs, epochs[r])
		}
	}
	tk.Agreeing, tk.Compared = Agree(picks)
	tk.OwnersAgreeing, _ = Agree(owners)
	if tk.Agreeing < tk.Compared {
		tk.Sample = disagreement(picks, said, idx, p.routers)
	}
	return tk
}

// disagreement describes the first prompt on which the routers' picks
// differ.
func disagreement(picks, said [][]string, idx []int, routers []Router) string {
	for j := range idx {
		first, differ := "", false
		for r := range picks {
			if picks[r][j] == "" {
				continue
			}
			if first == "" {
				first = picks[r][j]
			} else if picks[r][j] != first {
				differ = true
			}
		}
		if !differ {
			continue
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "probe prompt %d:", idx[j])
		for r := range picks {
			if picks[r][j] != "" {
				fmt.Fprintf(&b, " %s->%s", routers[r].Name, said[r][j])
			}
		}
		return b.String()
	}
	return ""
}

func isTimeoutOrRefused(err error) bool {
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || isDialError(err)
}

// snapshot asks one router for every prompt's backend ("" where it did not
// answer) and returns the highest epoch it answered with.
func (p *prober) snapshot(ctx context.Context, r Router) ([]string, uint64, error) {
	out := make([]string, len(p.prompts))
	var epoch uint64
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	failed := 0
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				var e agree.Explanation
				var err error
				for attempt := 0; attempt < 3; attempt++ {
					if e, err = p.explain(ctx, r, p.prompts[k]); err == nil {
						break
					}
				}
				mu.Lock()
				if err != nil {
					failed++
				} else {
					out[k] = e.Backend
					epoch = max(epoch, e.Epoch)
				}
				mu.Unlock()
			}
		}()
	}
	for k := range p.prompts {
		select {
		case next <- k:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if failed > len(p.prompts)/100 {
		return out, epoch, fmt.Errorf("%w: %s answered %d of %d explainer calls", ErrNotReady, r.Name, len(p.prompts)-failed, len(p.prompts))
	}
	return out, epoch, nil
}

// clusterView is the part of GET /v1/cluster the engine reads.
type clusterView struct {
	Node  string `json:"node"`
	Epoch uint64 `json:"epoch"`
	Raft  struct {
		RaftState string `json:"raft_state"`
		LeaderID  string `json:"leader_id"`
	} `json:"raft"`
	Leader string `json:"leader"`
}

func (v clusterView) leader() string {
	if v.Leader != "" {
		return v.Leader
	}
	return v.Raft.LeaderID
}
