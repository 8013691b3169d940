package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/ring"
)

func TestRecentKeys(t *testing.T) {
	var r recentKeys
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()
	const key uint64 = 0x9e3779b97f4a7c15
	if r.seen(key, now) {
		t.Fatal("a key never sent is predicted warm")
	}
	if !r.seen(key, now) || !r.seen(key, now+int64(time.Second)) {
		t.Fatal("a key sent a moment ago is predicted cold")
	}
	if !r.seen(key, now+int64(time.Second+recentWindow)) {
		t.Fatal("a key sent recentWindow ago is predicted cold")
	}
	if r.seen(key, now+int64(3*time.Second+2*recentWindow)) {
		t.Fatal("a key last sent over recentWindow ago is predicted warm")
	}
	// Another key of the same slot evicts it; one of another slot does not.
	other := key ^ 1<<40
	if r.seen(other, now) || r.seen(key+1, now) {
		t.Fatal("a key never sent is predicted warm")
	}
	if r.seen(key, now+int64(4*time.Second+2*recentWindow)) {
		t.Fatal("a key evicted from its slot is predicted warm")
	}
	if !r.seen(key+1, now+int64(time.Minute)) {
		t.Fatal("a key of another slot was evicted")
	}
	// Stamps wrap around every 2^24 s (194 days): a key sent just before
	// a wrap is warm just after it.
	wrap := int64(1<<recentStampBits) * int64(time.Second)
	if r.seen(key+7, wrap-int64(time.Second)) || !r.seen(key+7, wrap+int64(time.Second)) {
		t.Fatal("a key sent 2 s before across a stamp wrap-around is predicted cold")
	}
}

// TestRecentKeysConcurrent: many goroutines sending keys that share slots
// never see a key they did not send as warm, and always see their own
// key, sent a moment before, as warm unless another evicted it.
func TestRecentKeysConcurrent(t *testing.T) {
	var r recentKeys
	now := time.Now().UnixNano()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				// Goroutine g's keys: a tag of its own over 64 slots.
				key := uint64(g+1)<<48 | uint64(i%64)
				if r.seen(key, now) && i < 64 {
					t.Errorf("goroutine %d: its key %x, never sent, is warm", g, key)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestKindOf(t *testing.T) {
	plain := ring.KeyInfo{Key: 42}
	session := ring.KeyInfo{Key: 42, Session: true}
	// An ADAPTIVE key on its first block, and one routed past a split.
	var first, deeper ring.KeyInfo
	kc := ring.KeyConfig{ChainBlocks: 4}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a document of a few kilobytes ", 200) + `"}]}`)
	if err := ring.Extract(kc, ring.Chat, body, nil, &first); err != nil {
		t.Fatal(err)
	}
	first.Key = first.KeyAt(0)
	deeper = first
	deeper.Key = deeper.KeyAt(2)
	for _, c := range []struct {
		d        ring.Decision
		info     *ring.KeyInfo
		adaptive bool
		want     kind
	}{
		{ring.Decision{Reason: ring.ReasonAffinity}, &plain, false, kindAffinity},
		{ring.Decision{Reason: ring.ReasonAffinity}, &first, true, kindAffinity},
		{ring.Decision{Reason: ring.ReasonAffinity}, &deeper, true, kindSplit},
		{ring.Decision{Reason: ring.ReasonAffinity}, &deeper, false, kindAffinity}, // FIXED keys are never split
		{ring.Decision{Reason: ring.ReasonAffinity}, &session, true, kindSession},
		{ring.Decision{Reason: ring.ReasonOverflow, Rank: 2}, &deeper, true, kindOverflow},
		{ring.Decision{Reason: ring.ReasonOverflow, Rank: 1}, &session, false, kindOverflow},
		{ring.Decision{Reason: ring.ReasonFallback, Rank: 0}, &plain, false, kindFallback},
		{ring.Decision{Reason: ring.ReasonConsistentHash, Rank: 0}, &plain, false, kindAffinity},
		{ring.Decision{Reason: ring.ReasonConsistentHash, Rank: 0}, &session, false, kindSession},
		{ring.Decision{Reason: ring.ReasonConsistentHash, Rank: 3}, &plain, false, kindOverflow},
		{ring.Decision{Reason: ring.ReasonConsistentHash, Rank: -1}, &plain, false, kindFallback},
		{ring.Decision{Reason: ring.ReasonRandom, Rank: -1}, &plain, false, kindOther},
		{ring.Decision{Reason: ring.ReasonRoundRobin, Rank: -1}, &plain, false, kindOther},
		{ring.Decision{Reason: ring.ReasonLeastOutstanding, Rank: -1}, &plain, false, kindOther},
		{ring.Decision{Reason: ring.Reason(200)}, &plain, false, kindOther},
	} {
		if got := kindOf(c.d, c.info.Session, pastSplit(c.info, c.adaptive)); got != c.want {
			t.Errorf("%s rank %d (session %v, adaptive %v, past a split %v): kind %s, want %s",
				c.d.Reason, c.d.Rank, c.info.Session, c.adaptive, c.info == &deeper, kindNames[got], kindNames[c.want])
		}
	}
}

// TestCacheCount: what one answer adds, by prediction and usage.
func TestCacheCount(t *testing.T) {
	type row struct {
		pr   prediction
		r    usageReport
		want CacheFigures
	}
	// A body of 6,000 bytes whose prompt is 1,500 tokens: 4 bytes a token.
	aff := func(warm bool) prediction {
		return prediction{kind: kindAffinity, warm: warm, prefix: 1024, body: 6000}
	}
	for _, c := range []row{
		{aff(true), ok(1500, 1488),
			CacheFigures{Kind: "affinity", Answers: 1, Reported: 1, PredictedWarm: 1, DeliveredWarm: 1, BothWarm: 1, PromptTokens: 1500, CachedTokens: 1488, PredictedTokens: 256}},
		{aff(false), ok(1500, 0),
			CacheFigures{Kind: "affinity", Answers: 1, Reported: 1, PromptTokens: 1500}},
		// Half the key's prefix is enough; less is cold (a shared template).
		{prediction{kind: kindOverflow, prefix: 1024, body: 6000}, ok(1500, 128),
			CacheFigures{Kind: "overflow", Answers: 1, Reported: 1, DeliveredWarm: 1, PromptTokens: 1500, CachedTokens: 128}},
		{prediction{kind: kindOverflow, prefix: 1024, body: 6000}, ok(1500, 112),
			CacheFigures{Kind: "overflow", Answers: 1, Reported: 1, PromptTokens: 1500, CachedTokens: 112}},
		// Bytes count as the answer's tokens have it: 2 bytes a token here
		// (a language the tokenizer cuts finer), so half the key is 256.
		{aff(true), ok(3000, 240),
			CacheFigures{Kind: "affinity", Answers: 1, Reported: 1, PredictedWarm: 1, PromptTokens: 3000, CachedTokens: 240, PredictedTokens: 512}},
		// Past a split at 6 KiB: the split prefix (1,536 tokens), which
		// every backend that took a share of it holds, is not enough;
		// half the block past it (128 more) is.
		{prediction{kind: kindSplit, warm: true, prefix: 7168, before: 6144, body: 12000}, ok(3000, 1600),
			CacheFigures{Kind: "split", Answers: 1, Reported: 1, PredictedWarm: 1, PromptTokens: 3000, CachedTokens: 1600, PredictedTokens: 1792}},
		{prediction{kind: kindSplit, warm: true, prefix: 7168, before: 6144, body: 12000}, ok(3000, 1664),
			CacheFigures{Kind: "split", Answers: 1, Reported: 1, PredictedWarm: 1, DeliveredWarm: 1, BothWarm: 1, PromptTokens: 3000, CachedTokens: 1664, PredictedTokens: 1792}},
		// The prediction never counts more tokens than the prompt has.
		{prediction{kind: kindFallback, warm: true, prefix: 4096, body: 2400}, ok(600, 592),
			CacheFigures{Kind: "fallback", Answers: 1, Reported: 1, PredictedWarm: 1, DeliveredWarm: 1, BothWarm: 1, PromptTokens: 600, CachedTokens: 592, PredictedTokens: 600}},
		// A session names no prompt text: any cached token is warm.
		{prediction{kind: kindSession, warm: true, body: 3600}, ok(900, 16),
			CacheFigures{Kind: "session", Answers: 1, Reported: 1, PredictedWarm: 1, DeliveredWarm: 1, BothWarm: 1, PromptTokens: 900, CachedTokens: 16}},
		{prediction{kind: kindSession, warm: true, body: 3600}, noDetails(900),
			CacheFigures{Kind: "session", Answers: 1, Reported: 1, PredictedWarm: 1, PromptTokens: 900}},
		// Without a valid report nothing can be checked.
		{prediction{kind: kindOther, warm: true, prefix: 1024, body: 6000}, noReport(), CacheFigures{Kind: "other", Answers: 1}},
		{prediction{kind: kindOther, warm: true, prefix: 1024, body: 6000}, invalidReport(), CacheFigures{Kind: "other", Answers: 1}},
	} {
		var cc cacheCounts
		cc.count(c.pr, c.r)
		c.want.Rates()
		got := cc.figures()
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("%+v answered %v: %+v, want %+v", c.pr, c.r, got, c.want)
		}
	}
	var cc cacheCounts
	cc.count(prediction{}, ok(10, 10))
	if got := cc.figures(); got != nil {
		t.Errorf("a request without a key was counted: %+v", got)
	}
}

// gpusimBackends starts n fast gpusim instances in process.
func gpusimBackends(t *testing.T, n int) []ring.Backend {
	t.Helper()
	var bs []ring.Backend
	for i := range n {
		cfg := gpusim.FastConfig()
		cfg.Model = "m"
		cfg.Name = fmt.Sprintf("g%d", i)
		in, err := gpusim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(in.Handler())
		t.Cleanup(func() {
			_ = in.Close()
			srv.Close()
		})
		bs = append(bs, ring.Backend{ID: fmt.Sprintf("g%d/", i), Addr: srv.URL})
	}
	return bs
}

// documentPrompt is document d (about 6 KB, its own from the first byte
// on) and question q about it.
func documentPrompt(d, q int) string {
	return fmt.Sprintf("Document %d. ", d) + strings.Repeat(fmt.Sprintf("Paragraph of document %d, which the engine caches. ", d), 110) +
		fmt.Sprintf("\nQuestion %d: what does it say?", q)
}

// fleetFigures sums the figures of every backend's status per kind.
func fleetFigures(p *Proxy) map[string]CacheFigures {
	out := map[string]CacheFigures{}
	for _, b := range p.Status() {
		for _, f := range b.Cache {
			s := out[f.Kind]
			s.Kind = f.Kind
			s.Add(f)
			out[f.Kind] = s
		}
	}
	return out
}

// cacheMetric sums the samples of metric family name whose labels
// include want.
func cacheMetric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
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
	}
	return sum
}

// TestPredictedAgainstDelivered: two documents' questions, one after the
// other, through the proxy to gpusim, as complete answers, as streams on
// the relay and as streams on the goroutine path: each document's first
// question is predicted cold and is cold, the next ones are predicted
// warm and find the document cached, in /status and in the metrics. A
// stream that asks for no usage is counted, as unknown.
func TestPredictedAgainstDelivered(t *testing.T) {
	for _, c := range []struct {
		name  string
		relay bool
		extra string
	}{
		{"complete", true, `,"max_tokens":4`},
		{"relayed stream", true, `,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}`},
		{"goroutine stream", false, `,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testProxyConfig()
			cfg.StreamRelay = c.relay
			h := startProxyBackends(t, cfg, ring.DefaultConfig(), gpusimBackends(t, 3))
			for d := range 2 {
				for q := range 3 {
					resp, body := post(t, h.url+"/v1/chat/completions", chatReq(documentPrompt(d, q), c.extra))
					if resp.StatusCode != 200 {
						t.Fatalf("document %d question %d: %d %s", d, q, resp.StatusCode, body)
					}
					u := lastUsage(t, body, strings.Contains(c.extra, "stream"))
					if u == nil || u.PromptTokensDetails == nil {
						t.Fatalf("document %d question %d: no usage in %s", d, q, body)
					}
					if cached := u.PromptTokensDetails.CachedTokens; (q == 0) != (cached == 0) {
						t.Fatalf("document %d question %d: %d tokens cached", d, q, cached)
					}
					for _, k := range []string{"X-Warmroute-Predicted", "X-Warmroute-Cache", "X-Warmroute-Kind"} {
						if v := resp.Header.Get(k); v != "" {
							t.Fatalf("the answer tells the client %s: %s", k, v)
						}
					}
				}
			}
			// One stream without usage: predicted warm, delivered unknown.
			resp, body := post(t, h.url+"/v1/chat/completions", chatReq(documentPrompt(0, 9), `,"max_tokens":4,"stream":true`))
			if resp.StatusCode != 200 {
				t.Fatalf("stream without usage: %d %s", resp.StatusCode, body)
			}
			waitFor(t, func() bool { return fleetFigures(h.p)["affinity"].Answers == 7 }, "7 answers counted")
			if c.relay && strings.Contains(c.extra, "stream") {
				// The streams went through the relay, which keeps their
				// upstream connections.
				kept := int32(0)
				for _, b := range h.p.tab.Load().bs {
					kept += b.idleUps.n.Load()
				}
				if kept == 0 {
					t.Fatal("no stream went through the relay")
				}
			}
			got := fleetFigures(h.p)["affinity"]
			if len(fleetFigures(h.p)) != 1 || got.Reported != 6 || got.PredictedWarm != 4 || got.DeliveredWarm != 4 || got.BothWarm != 4 ||
				got.CachedTokens == 0 || got.PromptTokens <= got.CachedTokens {
				t.Fatalf("figures %+v", fleetFigures(h.p))
			}
			if got.PredictedHitRate != 4.0/6 || got.DeliveredHitRate != 4.0/6 {
				t.Errorf("hit rates %v predicted, %v delivered; want 4/6", got.PredictedHitRate, got.DeliveredHitRate)
			}
			for _, m := range []struct {
				predicted, delivered string
				want                 float64
			}{{"warm", "warm", 4}, {"cold", "cold", 2}, {"warm", "cold", 0}, {"cold", "warm", 0}, {"warm", "unknown", 1}, {"cold", "unknown", 0}} {
				n := cacheMetric(t, h.reg, "warmroute_cache_answers_total", map[string]string{"kind": "affinity", "predicted": m.predicted, "delivered": m.delivered})
				if n != m.want {
					t.Errorf("warmroute_cache_answers_total{predicted=%q,delivered=%q} = %v, want %v", m.predicted, m.delivered, n, m.want)
				}
			}
			warm := map[string]string{"kind": "affinity", "predicted": "warm"}
			if n := cacheMetric(t, h.reg, "warmroute_cache_cached_tokens_total", warm); n != float64(got.CachedTokens) {
				t.Errorf("cached tokens of the warm predictions %v, want all %d", n, got.CachedTokens)
			}
			if n := cacheMetric(t, h.reg, "warmroute_cache_prompt_tokens_total", map[string]string{"kind": "affinity"}); n != float64(got.PromptTokens) {
				t.Errorf("prompt tokens %v, want %d", n, got.PromptTokens)
			}
			// The key's 1,024 bytes, in the answers' tokens (gpusim's 4
			// bytes a token, over a body a little longer than the text).
			if got.PredictedTokens < 4*240 || got.PredictedTokens > 4*256 {
				t.Errorf("predicted tokens %d, want about %d", got.PredictedTokens, 4*256)
			}
			if n := cacheMetric(t, h.reg, "warmroute_cache_predicted_tokens_total", map[string]string{"kind": "affinity"}); n != float64(got.PredictedTokens) {
				t.Errorf("predicted tokens %v, want %d", n, got.PredictedTokens)
			}
		})
	}
}

// TestPredictedKinds: a key routed past a split, a session, the kinds of
// a full owner (overflow, fallback) and a key-blind strategy are counted
// as such.
func TestPredictedKinds(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		h := startProxyBackends(t, testProxyConfig(), ring.DefaultConfig(), gpusimBackends(t, 3))
		body := chatReq(documentPrompt(1, 0), `,"max_tokens":4`)
		var info ring.KeyInfo
		kc := h.ring.Config().Key()
		kc.ChainBlocks = 8
		if err := ring.Extract(kc, ring.Chat, []byte(body), nil, &info); err != nil {
			t.Fatal(err)
		}
		if err := h.p.SetSplits([]ring.Split{{Key: info.KeyAt(0), Depth: 0}}); err != nil {
			t.Fatal(err)
		}
		for q := range 2 {
			if resp, b := post(t, h.url+"/v1/chat/completions", chatReq(documentPrompt(1, q), `,"max_tokens":4`)); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		}
		got := fleetFigures(h.p)
		// Past the split, the key covers two blocks: about 512 tokens.
		if f := got["split"]; len(got) != 1 || f.Answers != 2 || f.PredictedWarm != 1 || f.BothWarm != 1 || f.DeliveredWarm != 1 ||
			f.PredictedTokens < 480 || f.PredictedTokens > 512 {
			t.Fatalf("figures %+v", got)
		}
	})
	t.Run("session", func(t *testing.T) {
		rc := ring.DefaultConfig()
		rc.SessionHeader = "X-Session-Id"
		h := startProxyBackends(t, testProxyConfig(), rc, gpusimBackends(t, 3))
		prompt := documentPrompt(2, 0)
		for turn := range 2 {
			prompt += fmt.Sprintf("\nTurn %d.", turn)
			if resp, b := post(t, h.url+"/v1/chat/completions", chatReq(prompt, `,"max_tokens":4`), "X-Session-Id", "s-1"); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		}
		got := fleetFigures(h.p)
		if f := got["session"]; len(got) != 1 || f.Answers != 2 || f.PredictedWarm != 1 || f.BothWarm != 1 || f.PredictedTokens != 0 {
			t.Fatalf("figures %+v", got)
		}
	})
	t.Run("overflow and fallback", func(t *testing.T) {
		arrived := make(chan struct{}, 4)
		release := make(chan struct{})
		handler := func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if strings.Contains(string(body), "hold") {
				arrived <- struct{}{}
				<-release
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, usageDoc(vllmUsage(1000, 0)))
		}
		a, b := newStub(t, "a", handler), newStub(t, "b", handler)
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		rc := ring.DefaultConfig()
		rc.ConcurrencyThreshold = 1
		h := startProxy(t, testProxyConfig(), rc, a, b)
		prompt := documentPrompt(3, 0)
		var wg sync.WaitGroup
		for range 2 {
			// The owner, then (the owner full) the other backend.
			wg.Add(1)
			go func() {
				defer wg.Done()
				post(t, h.url+"/v1/chat/completions", chatReq(prompt, `,"user":"hold"`))
			}()
			waitChan(t, arrived, 10*time.Second, "a held request")
		}
		// Both full: the least loaded of them.
		post(t, h.url+"/v1/chat/completions", chatReq(prompt, ""))
		close(release)
		wg.Wait()
		waitFor(t, func() bool { return fleetFigures(h.p)["affinity"].Answers == 1 }, "the held answers counted")
		got := fleetFigures(h.p)
		if len(got) != 3 || got["affinity"].Reported != 1 || got["affinity"].PredictedWarm != 0 ||
			got["overflow"].Reported != 1 || got["overflow"].PredictedWarm != 0 ||
			got["fallback"].Reported != 1 || got["fallback"].PredictedWarm != 1 || got["fallback"].DeliveredWarm != 0 {
			t.Fatalf("figures %+v", got)
		}
	})
	t.Run("key-blind strategy", func(t *testing.T) {
		rc := ring.DefaultConfig()
		rc.Strategy = ring.RoundRobin
		h := startProxyBackends(t, testProxyConfig(), rc, gpusimBackends(t, 2))
		for q := range 4 {
			if resp, b := post(t, h.url+"/v1/chat/completions", chatReq(documentPrompt(4, q), `,"max_tokens":4`)); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		}
		// Round robin over two: the third and fourth questions find the
		// key where the first and second went.
		got := fleetFigures(h.p)
		if f := got["other"]; len(got) != 1 || f.Answers != 4 || f.PredictedWarm != 2 || f.BothWarm != 2 {
			t.Fatalf("figures %+v", got)
		}
	})
	t.Run("no key", func(t *testing.T) {
		h := startProxyBackends(t, testProxyConfig(), ring.DefaultConfig(), gpusimBackends(t, 1))
		resp, err := http.Get(h.url + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := fleetFigures(h.p); resp.StatusCode != 200 || len(got) != 0 {
			t.Fatalf("GET /v1/models: %d, figures %+v", resp.StatusCode, got)
		}
	})
}
