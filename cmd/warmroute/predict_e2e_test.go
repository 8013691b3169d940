package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/proxy"
)

// cacheAnswer is what a test reads of one answer: where it went, why,
// the usage it reported and the names of its headers.
type cacheAnswer struct {
	backend, decision string
	prompt, cached    int
	headers           []string
}

// askCached sends a chat request for prompt (streamed with usage, or
// not) with the extra headers hdr (name, value pairs) and reads its
// answer's usage.
func askCached(t *testing.T, url, prompt string, stream bool, hdr ...string) cacheAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": gpusimModel, "max_tokens": 4, "stream": stream,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": prompt}},
	})
	if !stream {
		body, _ = json.Marshal(map[string]any{"model": gpusimModel, "max_tokens": 4,
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	type usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	var u *usage
	docs := [][]byte{b}
	if stream {
		docs = nil
		for _, line := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" {
				docs = append(docs, []byte(d))
			}
		}
	}
	for _, d := range docs {
		var doc struct {
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal(d, &doc); err != nil {
			t.Fatalf("answer %q: %v", d, err)
		}
		if doc.Usage != nil {
			u = doc.Usage
		}
	}
	if u == nil {
		t.Fatalf("no usage in %s", b)
	}
	a := cacheAnswer{backend: resp.Header.Get("X-Warmroute-Backend"), decision: resp.Header.Get("X-Warmroute-Decision"),
		prompt: u.PromptTokens, cached: u.PromptTokensDetails.CachedTokens}
	for k := range resp.Header {
		if k != "Content-Length" && k != "Transfer-Encoding" && k != "Content-Type" {
			a.headers = append(a.headers, k)
		}
	}
	slices.Sort(a.headers)
	return a
}

// metricSum sums the samples of a router's metric family whose labels
// include want.
func metricSum(t *testing.T, adminURL, family string, want map[string]string) float64 {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	f, ok := fams[family]
	if !ok {
		t.Fatalf("no %s in /metrics", family)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// TestE2EPredictedAgainstDelivered: a document's questions sent one at a
// time through the real binary to a gpusim fleet. The router predicts
// each document's first question cold (it never sent the document
// anywhere) and the next ones warm (it sent them to the same backend),
// and the engine delivers just that: no cached token for the first, the
// document cached for the next. /status, /metrics and 'warmroute status'
// show it per decision kind (affinity; a conversation keyed by its
// session header: session). No answer tells the client what was
// predicted: a warm prediction would tell it that someone sent the same
// prompt lately.
func TestE2EPredictedAgainstDelivered(t *testing.T) {
	t.Parallel()
	needBinary(t)
	urls := startGpusimFleet(t, 4)
	r := startRouter(t, proc.ServeArgs{Backends: urls, Extra: []string{"--session-header", "X-Session-Id"}})

	const docs, questions = 3, 3
	var cold, warm []string // header names of a cold and a warm answer
	for d := range docs {
		doc := fmt.Sprintf("Document %d. ", d) + strings.Repeat(fmt.Sprintf("A paragraph of document %d, which the fleet caches. ", d), 120)
		first := ""
		for q := range questions {
			a := askCached(t, r.url, doc+fmt.Sprintf("\nQuestion %d: what does it say?", q), d%2 == 1)
			if a.decision != "affinity" || (first != "" && a.backend != first) {
				t.Fatalf("document %d question %d: %s to %s (first to %s)", d, q, a.decision, a.backend, first)
			}
			first = a.backend
			if (q == 0) != (a.cached == 0) || a.cached > a.prompt {
				t.Fatalf("document %d question %d: %d of %d prompt tokens cached", d, q, a.cached, a.prompt)
			}
			if q == 0 {
				cold = a.headers
			} else {
				warm = a.headers
			}
		}
	}
	if !slices.Equal(cold, warm) {
		t.Errorf("a cold and a warm answer carry different headers: %v, %v", cold, warm)
	}
	// A conversation keyed by its session: its second turn is predicted
	// warm and finds its first cached.
	conv := strings.Repeat("A conversation that opens with a long message. ", 60)
	for turn := range 2 {
		conv += fmt.Sprintf("\nTurn %d.", turn)
		a := askCached(t, r.url, conv, turn == 1, "X-Session-Id", "conversation-1")
		if (turn == 0) != (a.cached == 0) {
			t.Fatalf("session turn %d: %d of %d prompt tokens cached", turn, a.cached, a.prompt)
		}
	}

	// The relay counts a stream when it ends, just after the client read
	// its last byte: wait for it.
	var st admin.Status
	want := map[string]proxy.CacheFigures{
		"affinity": {Answers: docs * questions, Reported: docs * questions, PredictedWarm: docs * (questions - 1),
			DeliveredWarm: docs * (questions - 1), BothWarm: docs * (questions - 1)},
		"session": {Answers: 2, Reported: 2, PredictedWarm: 1, DeliveredWarm: 1, BothWarm: 1},
	}
	match := func() bool {
		if len(st.Cache) != len(want) {
			return false
		}
		for _, f := range st.Cache {
			w := want[f.Kind]
			if f.Answers != w.Answers || f.Reported != w.Reported || f.PredictedWarm != w.PredictedWarm ||
				f.DeliveredWarm != w.DeliveredWarm || f.BothWarm != w.BothWarm || f.CachedTokens == 0 || f.CachedTokens >= f.PromptTokens {
				return false
			}
		}
		return true
	}
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		resp, err := http.Get(r.admin + "/status")
		if err != nil {
			return false, r.Alive()
		}
		defer resp.Body.Close()
		st = admin.Status{}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return false, err
		}
		return match(), nil
	}); err != nil {
		t.Fatalf("/status cache %+v, want %+v (%v)", st.Cache, want, err)
	}
	aff := st.Cache[0]
	if aff.Kind != "affinity" || aff.PredictedHitRate != 6.0/9 || aff.DeliveredHitRate != 6.0/9 ||
		aff.PredictedTokens < 6*240 || aff.PredictedTokens > 6*256 { // the key's 1,024 bytes, in the answers' tokens
		t.Errorf("affinity figures %+v", aff)
	}
	perBackend := 0
	for _, b := range st.Backends {
		for _, f := range b.Cache {
			if f.Kind == "affinity" {
				perBackend += int(f.Answers)
			}
		}
	}
	if perBackend != docs*questions {
		t.Errorf("the backends' own figures count %d affinity answers, want %d", perBackend, docs*questions)
	}

	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"kind": "affinity", "predicted": "warm", "delivered": "warm"}, docs * (questions - 1)},
		{map[string]string{"kind": "affinity", "predicted": "cold", "delivered": "cold"}, docs},
		{map[string]string{"kind": "affinity", "predicted": "warm", "delivered": "cold"}, 0},
		{map[string]string{"kind": "affinity", "predicted": "cold", "delivered": "warm"}, 0},
		{map[string]string{"kind": "session", "predicted": "warm", "delivered": "warm"}, 1},
		{map[string]string{"delivered": "unknown"}, 0},
	} {
		if got := metricSum(t, r.admin, "warmroute_cache_answers_total", c.labels); got != c.want {
			t.Errorf("warmroute_cache_answers_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	warmCached := metricSum(t, r.admin, "warmroute_cache_cached_tokens_total", map[string]string{"kind": "affinity", "predicted": "warm"})
	warmPrompt := metricSum(t, r.admin, "warmroute_cache_prompt_tokens_total", map[string]string{"kind": "affinity", "predicted": "warm"})
	coldCached := metricSum(t, r.admin, "warmroute_cache_cached_tokens_total", map[string]string{"kind": "affinity", "predicted": "cold"})
	if warmCached != float64(aff.CachedTokens) || coldCached != 0 || warmCached < 0.9*warmPrompt {
		t.Errorf("affinity tokens: %v of %v cached where predicted warm, %v where predicted cold; /status %+v", warmCached, warmPrompt, coldCached, aff)
	}
	if got := metricSum(t, r.admin, "warmroute_cache_predicted_tokens_total", map[string]string{"kind": "affinity"}); got != float64(aff.PredictedTokens) {
		t.Errorf("affinity predicted tokens %v, want %v", got, aff.PredictedTokens)
	}

	out, code := runCLIExit(t, nil, "status", "--admin", r.admin)
	if code != 0 || !strings.Contains(out, "WARM PRED/DELIV") || !regexpLine(out, `^affinity\s+9\s+9\s+6 \(66\.7%\)\s+6 \(66\.7%\)\s+6\s`) ||
		!regexpLine(out, `^session\s+2\s+2\s+1 \(50\.0%\)\s+1 \(50\.0%\)\s+1\s`) {
		t.Errorf("warmroute status: exit %d\n%s", code, out)
	}
}

// regexpLine reports whether a line of out matches expr.
func regexpLine(out, expr string) bool {
	return regexp.MustCompile(`(?m)` + expr).MatchString(out)
}
