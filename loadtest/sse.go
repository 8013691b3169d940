package loadtest

import (
	"bytes"
	"encoding/json"
)

// event is what one SSE line carries.
type event uint8

const (
	evSkip    event = iota // blank line, comment, non-data field, chunk without content
	evContent              // a chunk carrying generated text
	evDone                 // data: [DONE]
	evError                // an error object in the stream
)

// usage is the subset of an OpenAI usage object the load test reads.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usage) cached() int {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

var (
	dataPrefix   = []byte("data:")
	donePayload  = []byte("[DONE]")
	errorPrefix  = []byte(`{"error"`)
	usageKey     = []byte(`"usage":`)
	contentKey   = []byte(`"content":"`)
	textKey      = []byte(`"text":"`)
	reasoningKey = []byte(`"reasoning_content":"`)
)

// parseLine classifies one SSE line (without its line ending) without
// decoding the JSON of ordinary chunks: it only looks for a non-empty
// content, text or reasoning field. A chunk that carries a usage object is
// decoded (once per stream) into u, and hasUsage is set.
func parseLine(line []byte, u *usage) (ev event, hasUsage bool) {
	if !bytes.HasPrefix(line, dataPrefix) {
		return evSkip, false
	}
	p := bytes.TrimSpace(line[len(dataPrefix):])
	switch {
	case bytes.Equal(p, donePayload):
		return evDone, false
	case bytes.HasPrefix(p, errorPrefix):
		return evError, false
	}
	if i := bytes.Index(p, usageKey); i >= 0 {
		rest := bytes.TrimLeft(p[i+len(usageKey):], " \t")
		if len(rest) > 0 && rest[0] == '{' {
			var c struct {
				Usage *usage `json:"usage"`
			}
			if json.Unmarshal(p, &c) == nil && c.Usage != nil {
				*u = *c.Usage
				hasUsage = true
			}
		}
	}
	if nonEmpty(p, contentKey) || nonEmpty(p, textKey) || nonEmpty(p, reasoningKey) {
		return evContent, hasUsage
	}
	return evSkip, hasUsage
}

// nonEmpty reports whether p has key followed by at least one character
// before the closing quote.
func nonEmpty(p, key []byte) bool {
	for {
		i := bytes.Index(p, key)
		if i < 0 {
			return false
		}
		p = p[i+len(key):]
		if len(p) > 0 && p[0] != '"' {
			return true
		}
	}
}
