package agree

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// Router is one router's admin listener.
type Router struct {
	Name     string
	AdminURL string // http://127.0.0.1:P
}

// Request is one request to ask about: its API path (/v1/chat/completions)
// and body.
type Request struct {
	Path string
	Body []byte
}

// Config says whom to ask about what, and how often.
type Config struct {
	Routers  []Router
	Requests []Request
	// Every is the time from the start of one round to the next
	// (default 1 s: 16 requests a second to each router load the fleet little); a round that takes longer starts the next at once.
	Every time.Duration
	// Timeout bounds one explainer call (default 2 s).
	Timeout time.Duration
	// Client makes the calls (default: a client of its own, closed when
	// Run returns).
	Client *http.Client
}

// maxAnswer bounds an explainer answer read.
const maxAnswer = 1 << 20

// Explanation is the part of a route explainer's answer (POST
// /debug/route/<path>) the probes read.
type Explanation struct {
	Node       string      `json:"node"`
	Epoch      uint64      `json:"epoch"`
	Backend    string      `json:"backend"`
	Reason     string      `json:"reason"`
	Rank       int         `json:"rank"`
	Recompute  int64       `json:"recompute"`
	Candidates []Candidate `json:"candidates"`
}

// Candidate is one backend of an Explanation, in the partition's order.
type Candidate struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Healthy  bool   `json:"healthy"`
	InFlight int64  `json:"in_flight"`
	Queued   int64  `json:"queued"`
	Busy     bool   `json:"busy"`
}

// Owner is the load-blind choice: the first candidate in the partition's
// order that is active and healthy in the router's view ("" when none is).
func (e Explanation) Owner() string {
	for _, c := range e.Candidates {
		if c.Healthy && c.State == "active" {
			return c.ID
		}
	}
	return ""
}

// Run asks round after round until ctx ends and returns the counts.
func Run(ctx context.Context, cfg Config) stats.Agreement {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	hc := cfg.Client
	if hc == nil {
		tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}
		defer tr.CloseIdleConnections()
		hc = &http.Client{Transport: tr}
	}
	out := stats.Agreement{Routers: len(cfg.Routers)}
	if len(cfg.Routers) < 2 || len(cfg.Requests) == 0 {
		return out
	}
	t := time.NewTicker(cfg.Every)
	defer t.Stop()
	for {
		r := round(ctx, hc, cfg)
		if ctx.Err() != nil {
			return out // a round cut short is not counted
		}
		out.Add(r)
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
	}
}

// round asks every router about every request: one request at a time,
// the routers at once, so that their answers to a request are as close
// in time as the calls allow. (Asking each router about the requests in
// turn, the routers in parallel, let their answers to the last requests
// drift apart by the sum of the calls' latencies, tens of milliseconds on
// a loaded machine, and counted the loads' changes in between as
// disagreement.)
func round(ctx context.Context, hc *http.Client, cfg Config) stats.Agreement {
	n, m := len(cfg.Routers), len(cfg.Requests)
	answers := make([][]Explanation, n)
	ok := make([][]bool, n)
	for i := range cfg.Routers {
		answers[i], ok[i] = make([]Explanation, m), make([]bool, m)
	}
	var wg sync.WaitGroup
	for j, q := range cfg.Requests {
		for i := range cfg.Routers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e, err := explain(ctx, hc, cfg.Timeout, cfg.Routers[i].AdminURL, q)
				answers[i][j], ok[i][j] = e, err == nil
			}()
		}
		wg.Wait()
	}
	return tally(cfg.Routers, answers, ok)
}

// tally counts one round: a request is compared when at least two routers
// answered it, and agrees when they all named the same backend (owner).
// The round's epochs agree when every router answered at one epoch; its
// requests then also count as the steady state's.
func tally(routers []Router, answers [][]Explanation, ok [][]bool) stats.Agreement {
	out := stats.Agreement{Routers: len(routers), Rounds: 1, SameEpoch: 1}
	epoch, seen := uint64(0), false
	for j := range answers[0] {
		var first Explanation
		got, picks, owners := 0, true, true
		for i := range routers {
			if !ok[i][j] {
				out.Failed++
				continue
			}
			e := answers[i][j]
			if !seen {
				epoch, seen = e.Epoch, true
			} else if e.Epoch != epoch {
				out.SameEpoch = 0
			}
			if got == 0 {
				first = e
			} else {
				picks = picks && e.Backend == first.Backend
				owners = owners && e.Owner() == first.Owner()
			}
			got++
		}
		if got < 2 {
			continue
		}
		out.Compared++
		if picks {
			out.Picks++
		} else if out.First == "" {
			out.First = describe(routers, answers, ok, j)
		}
		if owners {
			out.Owners++
		}
	}
	if out.SameEpoch == 1 {
		out.SteadyCompared, out.SteadyPicks, out.FirstSteady = out.Compared, out.Picks, out.First
	}
	return out
}

// describe names what each router picked for request j, and what it saw
// of the first candidate (the owner): its in-flight count and queue, and
// the request's recompute cost, the figures the COST rule weighs; and of
// the candidates after the owner up to the furthest any router picked,
// their in-flight counts and queues (b: taken to queue). What the answers
// name is cut to describedName bytes, and at most describedAfter
// candidates after the owner are listed: a description stays a line
// whatever a router answers.
func describe(routers []Router, answers [][]Explanation, ok [][]bool, j int) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "request %d:", j)
	far := 0
	for i := range routers {
		if ok[i][j] {
			far = max(far, answers[i][j].Rank)
		}
	}
	for i, r := range routers {
		if !ok[i][j] {
			continue
		}
		e := answers[i][j]
		if e.Reason == "overflow" {
			fmt.Fprintf(&b, " %s->%s (overflow rank %d", r.Name, cut(e.Backend), e.Rank)
		} else {
			fmt.Fprintf(&b, " %s->%s (%s", r.Name, cut(e.Backend), cut(e.Reason))
		}
		if len(e.Candidates) > 0 {
			c := e.Candidates[0]
			fmt.Fprintf(&b, "; owner in flight %d, queued %d; recompute %d", c.InFlight, c.Queued, e.Recompute)
		}
		if far > 0 && len(e.Candidates) > 1 {
			b.WriteString("; then")
			for _, c := range e.Candidates[1:min(far+1, describedAfter+1, len(e.Candidates))] {
				fmt.Fprintf(&b, " %s %d/%d", cut(c.ID), c.InFlight, c.Queued)
				if c.Busy {
					b.WriteString("b")
				}
			}
		}
		b.WriteByte(')')
	}
	return b.String()
}

// Bounds of a description (describe).
const (
	describedName  = 64
	describedAfter = 8
)

// cut returns s, or its first describedName bytes and "...".
func cut(s string) string {
	if len(s) <= describedName {
		return s
	}
	return s[:describedName] + "..."
}

// explain asks one router where q would go.
func explain(ctx context.Context, hc *http.Client, timeout time.Duration, adminURL string, q Request) (Explanation, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var e Explanation
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, adminURL+"/debug/route"+q.Path, bytes.NewReader(q.Body))
	if err != nil {
		return e, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return e, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return e, err
	}
	if len(b) > maxAnswer {
		return e, fmt.Errorf("explainer answer over %d bytes", maxAnswer)
	}
	if resp.StatusCode != http.StatusOK {
		return e, fmt.Errorf("explainer: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("explainer answer: %w", err)
	}
	return e, nil
}
