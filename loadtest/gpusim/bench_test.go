package gpusim

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkParseAndShapeChat measures the per-request CPU of decoding a
// ~2,000-token chat request and hashing its prompt blocks.
func BenchmarkParseAndShapeChat(b *testing.B) {
	body := []byte(chatBody(words("policy", 8000), `,"max_tokens":64,"stream":true`))
	buf := make([]byte, 0, 16<<10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		p, err := parseRequest(body, endpointChat, 4, buf)
		if err != nil {
			b.Fatal(err)
		}
		s := shapePrompt(p.text, p.unit, 16, "", "")
		if s.tokens < 2000 {
			b.Fatal(s.tokens)
		}
		buf = p.text[:0]
	}
}

// BenchmarkStreamingChat measures one whole streamed request through the
// handler (64 tokens, ~2,000-token prompt, instant model, so the tokens
// leave in one merged chunk), client included.
func BenchmarkStreamingChat(b *testing.B) {
	cfg := DefaultConfig()
	cfg.TimeScale = 1e-6
	in, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(in.Handler())
	defer func() {
		_ = in.Close()
		srv.Close()
	}()
	body := chatBody(words("policy", 8000), `,"max_tokens":64,"stream":true`)
	c := srv.Client()
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n < 500 {
			b.Fatalf("status %d, %d bytes", resp.StatusCode, n)
		}
	}
}
