package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// startGpusimCold runs a cold `warmroute gpusim` fleet of n instances at
// gpusim's real speed (time scale 1: about 200 ms a request here), so that
// requests sent one at a time reach the router at the rate a person's
// would, and returns their URLs.
func startGpusimCold(t *testing.T, n int) []string {
	t.Helper()
	a := proc.GpusimArgs{Instances: n, Listen: "127.0.0.1:0", TimeScale: 1}
	p, err := proc.Start(proc.Spec{Name: "gpusim", Path: binPath, Args: a.Args()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	var urls []string
	if err := p.WaitReady(context.Background(), 15*time.Second, func(context.Context) error {
		urls = urls[:0]
		for _, m := range gpusimURLs.FindAllStringSubmatch(p.Logs(), -1) {
			urls = append(urls, m[1])
		}
		if len(urls) < n {
			return errors.New("not every address printed yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return urls
}

// idleDoc is document d of the idle case: about 6 KB of text that differs
// from the first line.
func idleDoc(d int) string {
	rng := rand.New(rand.NewPCG(uint64(d), 99))
	var b strings.Builder
	fmt.Fprintf(&b, "Document %d, a report on topic %d.\n", d, d*31)
	for b.Len() < 6000 {
		fmt.Fprintf(&b, "w%x ", rng.Uint32()%4096)
	}
	return b.String()
}

// idleReply is what the idle case reads of an answer.
type idleReply struct {
	backend        string
	prompt, cached int
}

// ask sends one chat request, not streamed, and returns who answered and
// the usage the engine reported.
func ask(t *testing.T, c *http.Client, url string, messages ...[2]string) idleReply {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	req := struct {
		Model     string `json:"model"`
		Messages  []msg  `json:"messages"`
		MaxTokens int    `json:"max_tokens"`
	}{Model: gpusimModel, MaxTokens: 4}
	for _, m := range messages {
		req.Messages = append(req.Messages, msg{m[0], m[1]})
	}
	body, _ := json.Marshal(req)
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return idleReply{backend: resp.Header.Get("X-Warmroute-Backend"), prompt: out.Usage.PromptTokens, cached: out.Usage.PromptTokensDetails.CachedTokens}
}

// idleRun is what one strategy did with the idle case.
type idleRun struct {
	// backends[phase][group] are the backends that answered a document's
	// (or the system prompt's) questions.
	backends map[string]map[int]map[string]bool
	// prompt and cached tokens per phase.
	prompt, cached map[string]int
}

func (r idleRun) share(phase string) float64 {
	return float64(r.cached[phase]) / float64(max(1, r.prompt[phase]))
}

// runIdleCase sends the idle case, one request at a time, to a router
// with the given extra flags in front of 4 cold gpusim instances: 8
// documents of about 6 KB with 8 questions each, document by document;
// 8 other documents with their questions interleaved; and a 5 KB system
// prompt with 6 questions in a row.
func runIdleCase(t *testing.T, extra ...string) idleRun {
	t.Helper()
	urls := startGpusimCold(t, 4)
	r := startRouter(t, proc.ServeArgs{Backends: urls, Extra: extra})
	c := &http.Client{Timeout: 30 * time.Second}
	run := idleRun{backends: map[string]map[int]map[string]bool{}, prompt: map[string]int{}, cached: map[string]int{}}
	note := func(phase string, group int, rep idleReply) {
		if run.backends[phase] == nil {
			run.backends[phase] = map[int]map[string]bool{}
		}
		if run.backends[phase][group] == nil {
			run.backends[phase][group] = map[string]bool{}
		}
		run.backends[phase][group][rep.backend] = true
		run.prompt[phase] += rep.prompt
		run.cached[phase] += rep.cached
	}
	question := func(d, q int) string {
		return fmt.Sprintf("Question %d about document %d: what does section %d say?", q, d, q*3)
	}
	system := [2]string{"system", "Answer from the document the user gives."}
	for d := 0; d < 8; d++ {
		for q := 0; q < 8; q++ {
			note("document by document", d, ask(t, c, r.url, system, [2]string{"user", idleDoc(d) + "\n\n" + question(d, q)}))
		}
	}
	for q := 0; q < 8; q++ {
		for d := 8; d < 16; d++ {
			note("interleaved", d, ask(t, c, r.url, system, [2]string{"user", idleDoc(d) + "\n\n" + question(d, q)}))
		}
	}
	prompt := "You are the support assistant of a router. " + idleDoc(100)[:5000]
	for q := 0; q < 6; q++ {
		note("system prompt", 0, ask(t, c, r.url, [2]string{"system", prompt}, [2]string{"user", question(100, q)}))
	}
	return run
}

// TestE2EIdleDocumentsStayOnOneBackend: at concurrency 1, one router in
// front of 4 cold gpusim instances, PREFIX_AWARE with the defaults sent 3
// of 8 documents' questions (about 6 KB documents, 8 questions each, one
// document after the other) to 2-3 backends and cached 74-77% of prompt
// tokens against CONSISTENT_HASH's 85.7%: it split each document after a
// few questions for its share of the traffic, though every backend was
// idle. The 5th and 6th of six questions over a 5 KB system prompt went
// elsewhere too. Now a prefix is split only when its owner is pressed:
// every document, interleaved or not, and the system prompt stay on one
// backend, and the cached share equals CONSISTENT_HASH's.
func TestE2EIdleDocumentsStayOnOneBackend(t *testing.T) {
	t.Parallel()
	needBinary(t)
	pa := runIdleCase(t)
	ch := runIdleCase(t, "--strategy", "CONSISTENT_HASH")
	for _, phase := range []string{"document by document", "interleaved", "system prompt"} {
		t.Logf("%s: cached %.1f%% of prompt tokens under PREFIX_AWARE, %.1f%% under CONSISTENT_HASH", phase, 100*pa.share(phase), 100*ch.share(phase))
		for name, run := range map[string]idleRun{"PREFIX_AWARE": pa, "CONSISTENT_HASH": ch} {
			for g, bs := range run.backends[phase] {
				if len(bs) != 1 {
					t.Errorf("%s, %s: group %d went to %d backends: %v", name, phase, g, len(bs), bs)
				}
			}
		}
		if d := pa.share(phase) - ch.share(phase); d < -0.001 || d > 0.001 {
			t.Errorf("%s: PREFIX_AWARE cached %.2f%% of prompt tokens, CONSISTENT_HASH %.2f%%", phase, 100*pa.share(phase), 100*ch.share(phase))
		}
	}
}
