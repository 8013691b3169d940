package loadtest

import (
	"testing"
)

func TestParseLine(t *testing.T) {
	cases := []struct {
		line      string
		ev        event
		hasUsage  bool
		prompt    int
		completed int
		cached    int
	}{
		{"", evSkip, false, 0, 0, 0},
		{": keep-alive", evSkip, false, 0, 0, 0},
		{"event: message", evSkip, false, 0, 0, 0},
		{"data: [DONE]", evDone, false, 0, 0, 0},
		{"data:[DONE]", evDone, false, 0, 0, 0},
		{`data: {"error":{"message":"boom","type":"x"}}`, evError, false, 0, 0, 0},
		// vLLM's first chat chunk: role, empty content
		{`data: {"id":"1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, evSkip, false, 0, 0, 0},
		{`data: {"id":"1","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`, evContent, false, 0, 0, 0},
		{`data: {"id":"1","choices":[{"index":0,"delta":{"content":"\"q"},"finish_reason":null}]}`, evContent, false, 0, 0, 0},
		{`data: {"id":"1","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`, evContent, false, 0, 0, 0},
		{`data: {"id":"1","choices":[{"index":0,"text":" lo","finish_reason":null}]}`, evContent, false, 0, 0, 0},
		{`data: {"id":"1","choices":[{"index":0,"text":"","finish_reason":"length"}]}`, evSkip, false, 0, 0, 0},
		{`data: {"id":"1","choices":[{"delta":{"content":"x"}}],"usage":null}`, evContent, false, 0, 0, 0},
		{`data: {"id":"1","choices":[],"usage":{"prompt_tokens":120,"total_tokens":152,"completion_tokens":32,"prompt_tokens_details":{"cached_tokens":96}}}`, evSkip, true, 120, 32, 96},
		{`data: {"choices":[],"usage": {"prompt_tokens":5,"completion_tokens":1}}`, evSkip, true, 5, 1, 0},
		// usage together with the last token (continuous usage stats)
		{`data: {"choices":[{"delta":{"content":"!"}}],"usage":{"prompt_tokens":7,"completion_tokens":3}}`, evContent, true, 7, 3, 0},
		{`data: {"choices":[],"usage":{"prompt_tokens":"bad"}}`, evSkip, false, 0, 0, 0},
	}
	for _, c := range cases {
		var u usage
		ev, hu := parseLine([]byte(c.line), &u)
		if ev != c.ev || hu != c.hasUsage {
			t.Errorf("%s: event %d usage %v, want %d %v", c.line, ev, hu, c.ev, c.hasUsage)
			continue
		}
		if hu && (u.PromptTokens != c.prompt || u.CompletionTokens != c.completed || u.cached() != c.cached) {
			t.Errorf("%s: usage %+v", c.line, u)
		}
	}
}

func FuzzParseLine(f *testing.F) {
	f.Add(`data: {"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":32,"prompt_tokens_details":{"cached_tokens":96}}}`)
	f.Add(`data: {"choices":[{"delta":{"content":"x"}}]}`)
	f.Add("data: [DONE]")
	f.Add(`data: {"error":{}}`)
	f.Add(`data: "usage": {`)
	f.Fuzz(func(t *testing.T, line string) {
		var u usage
		ev, hu := parseLine([]byte(line), &u)
		if ev > evError {
			t.Fatalf("unknown event %d", ev)
		}
		if !hu && u != (usage{}) {
			t.Fatalf("usage written without being reported: %+v", u)
		}
	})
}
