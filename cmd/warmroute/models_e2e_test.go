package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// TestE2EModelAwareRouting runs the real binary in front of a mixed fleet:
// two gpusim instances serving llama, two serving qwen, and an engine
// serving llama with a LoRA adapter (llama-sql) loaded. Each request must
// land only on a backend serving its model, /v1/models must list every
// model, and an unknown model must get 404 model_not_found.
func TestE2EModelAwareRouting(t *testing.T) {
	t.Parallel()
	needBinary(t)
	serves := map[string][]string{}
	var urls []string
	for _, m := range []string{"llama", "llama", "qwen", "qwen"} {
		u := startGpusim(t, "--model", m)
		urls = append(urls, u)
		serves[strings.TrimPrefix(u, "http://")] = []string{m}
	}
	adapter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"llama","object":"model","root":"llama","parent":null},`+
				`{"id":"llama-sql","object":"model","root":"/adapters/sql","parent":"llama"}]}`)
		case "/v1/chat/completions":
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
		}
	}))
	t.Cleanup(adapter.Close)
	urls = append(urls, adapter.URL)
	serves[strings.TrimPrefix(adapter.URL, "http://")] = []string{"llama", "llama-sql"}

	r := startRouter(t, proc.ServeArgs{Backends: urls})
	post := func(model, prompt string) (int, string, string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]}`, model, prompt)
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Warmroute-Backend"), string(b)
	}
	// Once the router has heard every backend's /v1/models, a model none
	// serves is refused (until then, unknown backends take anything).
	if _, err := pollUntil(20*time.Second, func() (bool, error) {
		// (gpusim refuses a model it does not serve with 404 too, in
		// vLLM's words; the router's answer names model_not_found.)
		code, _, body := post("mistral", "x")
		return code == http.StatusNotFound && strings.Contains(body, `"code":"model_not_found"`), nil
	}); err != nil {
		t.Fatalf("the router never learned what its backends serve: %v", err)
	}
	code, _, body := post("mistral", "x")
	if code != http.StatusNotFound || !strings.Contains(body, `"code":"model_not_found"`) || !strings.Contains(body, "mistral") {
		t.Fatalf("unknown model: %d %s", code, body)
	}
	for _, model := range []string{"llama", "qwen", "llama-sql"} {
		for i := 0; i < 12; i++ {
			code, b, body := post(model, fmt.Sprintf("question %d about %s", i, model))
			if code != http.StatusOK || !slices.Contains(serves[b], model) {
				t.Fatalf("%s: %d from %s, which serves %v: %s", model, code, b, serves[b], body)
			}
		}
	}
	resp, err := http.Get(r.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/models: %d %v", resp.StatusCode, err)
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	if want := []string{"llama", "llama-sql", "qwen"}; !slices.Equal(ids, want) {
		t.Fatalf("/v1/models lists %v, want %v", ids, want)
	}
}
