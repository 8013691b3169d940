package admin

import (
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// TestExplainAPI: the route explainer takes every keyed endpoint's path.
func TestExplainAPI(t *testing.T) {
	for path, want := range map[string]ring.API{
		"":                     ring.Chat,
		"/v1/chat/completions": ring.Chat,
		"/v1/completions":      ring.Completions,
		"/invocations":         ring.Invocations,
		"/v1/responses":        ring.Responses,
		"/v1/embeddings":       ring.Embeddings,
		"/v2/rerank":           ring.Rerank,
		"/v1/score":            ring.Score,
		"/tokenize":            ring.Tokenize,
		"/detokenize":          ring.Detokenize,
	} {
		if got, err := explainAPI(path, ""); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", path, got, err, want)
		}
	}
	if _, err := explainAPI("/v1/audio/transcriptions", ""); err == nil {
		t.Error("an unkeyed endpoint accepted")
	}
}
