package gpusim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testServer struct {
	in  *Instance
	srv *httptest.Server
	c   *http.Client
}

// startInstance serves one instance; cleanup closes the instance (aborting
// in-flight requests) before the server.
func startInstance(t *testing.T, cfg Config) *testServer {
	t.Helper()
	in, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(in.Handler())
	t.Cleanup(func() {
		_ = in.Close()
		srv.Close()
	})
	return &testServer{in: in, srv: srv, c: srv.Client()}
}

func (ts *testServer) do(t *testing.T, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := ts.c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp, b
}

// usage is the usage object of a response or of a stream's last chunk.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// postJSON sends a non-streaming request and decodes a 200 answer.
func (ts *testServer) postJSON(t *testing.T, path, body string) completion {
	t.Helper()
	resp, b := ts.do(t, http.MethodPost, path, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("POST %s: decoding %s: %v", path, b, err)
	}
	if c.Usage == nil {
		t.Fatalf("POST %s: no usage in %s", path, b)
	}
	return c
}

// streamResult is a parsed SSE response.
type streamResult struct {
	chunks   []completion
	text     string
	usage    *usage
	done     bool
	ttft     time.Duration // request sent -> first chunk with text
	firstAt  time.Time     // when the first chunk with text arrived
	finish   string
	instance string
}

// stream posts a streaming request and reads every event.
func (ts *testServer) stream(t *testing.T, ctx context.Context, path, body string) streamResult {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := ts.c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q, want text/event-stream", ct)
	}
	r := streamResult{instance: resp.Header.Get("X-Gpusim-Instance")}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var sb strings.Builder
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if r.done {
			t.Fatalf("event after [DONE]: %q", line)
		}
		if string(data) == "[DONE]" {
			r.done = true
			continue
		}
		var c completion
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		r.chunks = append(r.chunks, c)
		if c.Usage != nil {
			r.usage = c.Usage
		}
		for _, ch := range c.Choices {
			piece := ch.Text + ch.Delta.Content
			if piece != "" && r.ttft == 0 {
				r.firstAt = time.Now()
				r.ttft = r.firstAt.Sub(start)
			}
			sb.WriteString(piece)
			if ch.FinishReason != nil {
				r.finish = *ch.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	r.text = sb.String()
	return r
}

// words returns n bytes of varied text starting with tag (for distinct
// prompts of a known length).
func words(tag string, n int) string {
	var sb strings.Builder
	sb.WriteString(tag)
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, " w%d", i)
	}
	return sb.String()[:n]
}

func chatBody(content string, extra string) string {
	b, _ := json.Marshal(content)
	return fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-70B-Instruct","messages":[{"role":"user","content":%s}]%s}`, b, extra)
}

// tokenIDs returns a completions body whose prompt is the given token ids.
func tokenIDsBody(ids []int, extra string) string {
	b, _ := json.Marshal(ids)
	return fmt.Sprintf(`{"prompt":%s%s}`, b, extra)
}

func seqIDs(from, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = from + i
	}
	return ids
}

func newServerFor(t *testing.T, in *Instance) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(in.Handler())
	t.Cleanup(func() {
		_ = in.Close()
		srv.Close()
	})
	return srv
}

// fakeSrv wraps a URL so testServer helpers work against a fleet instance.
func fakeSrv(url string) *httptest.Server { return &httptest.Server{URL: url} }
