package gpusim

import (
	"errors"
	"testing"
)

// TestPromptBlocksPredictsTheInstance sends requests one at a time to an
// instance with room for all of them, and checks that the cached tokens it
// reports are what PromptBlocks' chains predict: the longest prefix of the
// chain seen in any earlier request, at most (tokens-1)/16 blocks.
func TestPromptBlocksPredictsTheInstance(t *testing.T) {
	ts := startInstance(t, FastConfig())
	sys := words("system policy", 2000)
	chat := func(user string) string {
		return `{"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"` + user + `"}],"max_tokens":1}`
	}
	doc := words("doc", 3000)
	reqs := []struct{ path, body string }{
		{"/v1/chat/completions", chat("first question")},
		{"/v1/chat/completions", chat("another question")},
		{"/invocations", chat("a third one, through SageMaker's path")},
		{"/v1/completions", `{"prompt":"` + doc + words("A", 300) + `","max_tokens":1}`},
		{"/v1/completions", `{"prompt":["` + doc + words("B", 100) + `"],"max_tokens":1}`},
		{"/v1/completions", `{"prompt":"` + doc + words("A", 300) + `","max_tokens":1}`}, // all but the last block
		{"/v1/completions", `{"prompt":"` + doc + `","max_tokens":1,"cache_salt":"tenant-2"}`},
		{"/v1/completions", `{"prompt":"` + doc + `","max_tokens":1,"cache_salt":"tenant-2"}`},
		{"/v1/completions", tokenIDsBody(seqIDs(0, 100), `,"max_tokens":1`)},
		{"/v1/completions", tokenIDsBody(append(seqIDs(0, 64), seqIDs(900, 9)...), `,"max_tokens":1`)},
	}
	seen := map[uint64]bool{}
	for i, r := range reqs {
		chain, tokens, err := PromptBlocks(r.path, []byte(r.body), 4, 16)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if len(chain) != tokens/16 {
			t.Fatalf("request %d: %d blocks for %d tokens", i, len(chain), tokens)
		}
		hit := 0
		for hit < len(chain) && hit < (tokens-1)/16 && seen[chain[hit]] {
			hit++
		}
		for _, h := range chain {
			seen[h] = true
		}
		u := ts.postJSON(t, r.path, r.body).Usage
		if u.PromptTokens != tokens || u.PromptTokensDetails.CachedTokens != hit*16 {
			t.Fatalf("request %d: instance says %d tokens, %d cached; PromptBlocks predicts %d, %d",
				i, u.PromptTokens, u.PromptTokensDetails.CachedTokens, tokens, hit*16)
		}
		if i == 1 && hit == 0 || i == 5 && hit != (tokens-1)/16 || i == 6 && hit != 0 || i == 7 && hit == 0 {
			t.Fatalf("request %d: hit %d blocks of %d tokens: the cases do not test what they say", i, hit, tokens)
		}
	}
}

func TestPromptBlocksErrors(t *testing.T) {
	for _, c := range []struct {
		path, body string
		bpt, bs    int
		want       error
	}{
		{"/v1/embeddings", `{"prompt":"x"}`, 4, 16, ErrUnknownPath},
		{"/v1/completions", `{"prompt":"x"}`, 0, 16, ErrInvalidConfig},
		{"/v1/completions", `{"prompt":"x"}`, 4, 0, ErrInvalidConfig},
	} {
		if _, _, err := PromptBlocks(c.path, []byte(c.body), c.bpt, c.bs); !errors.Is(err, c.want) {
			t.Errorf("%s %s (%d, %d): %v, want %v", c.path, c.body, c.bpt, c.bs, err, c.want)
		}
	}
	for _, body := range []string{`{"prompt":""}`, `{"messages":`, `{"max_tokens":3}`, `{"prompt":"x","n":2}`} {
		if _, _, err := PromptBlocks("/v1/completions", []byte(body), 4, 16); err == nil {
			t.Errorf("%s: no error", body)
		}
	}
}
