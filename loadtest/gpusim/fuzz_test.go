package gpusim

import (
	"testing"
)

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url"}]},{"role":"assistant","content":null}]}`,
		`{"prompt":"once upon a time","max_tokens":1}`,
		`{"prompt":[1,2,3,4],"n":1}`,
		`{"prompt":[[5,6,7]]}`,
		`{"prompt":["one"],"cache_salt":"x"}`,
		`{"prompt":["a","b"]}`,
		`{"messages":null,"prompt":null}`,
		`{"max_completion_tokens":-1,"messages":[]}`,
		`[1,2]`, `null`, `{"prompt":"\u00e9\ud83d\ude00"}`, ``,
	} {
		for ep := byte(0); ep < 3; ep++ {
			f.Add([]byte(s), ep)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, ep byte) {
		e := endpoint(ep % 3)
		p, err := parseRequest(body, e, 4, nil)
		if err != nil {
			if err.status < 400 || err.status > 499 || err.typ == "" || err.message == "" {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if len(p.text) == 0 || (p.unit != 4) {
			t.Fatalf("accepted request with text %d bytes, unit %d", len(p.text), p.unit)
		}
		if p.limited && p.maxTokens < 1 {
			t.Fatalf("accepted max_tokens %d", p.maxTokens)
		}
		if e == endpointChat && !p.chat || e == endpointCompletion && p.chat {
			t.Fatalf("endpoint %d parsed as chat=%v", e, p.chat)
		}
		s := shapePrompt(p.text, p.unit, 16, p.salt, "")
		if s.tokens < 1 || len(s.hashes) != s.tokens/16 {
			t.Fatalf("shape %d tokens %d blocks", s.tokens, len(s.hashes))
		}
	})
}
