package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// TestModelAwareRouting: with what each backend serves known, a request
// lands only on a backend serving its model (an adapter's included), the
// same key of one model always on the same backend, an unknown model gets
// 404 model_not_found, a request without a model uses the whole fleet,
// backends whose models are not known take any model, and /v1/models is
// the union of what the healthy backends serve.
func TestModelAwareRouting(t *testing.T) {
	var stubs []*stub
	for i := 0; i < 6; i++ {
		stubs = append(stubs, newStub(t, fmt.Sprintf("s%d", i), nil))
	}
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), stubs...)
	ids := make([]string, len(stubs))
	for i, b := range h.ring.Backends() {
		ids[i] = b.ID
	}
	serves := map[string][]string{
		ids[0]: {"llama"}, ids[1]: {"llama"}, ids[2]: {"llama", "llama-sql-lora"},
		ids[3]: {"qwen"}, ids[4]: {"qwen"},
		// ids[5]: not known
	}
	h.p.SetModels(serves)
	url := h.url + "/v1/chat/completions"
	send := func(model, prompt string) (int, string, []byte) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, prompt)
		if model == "" {
			body = fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, prompt)
		}
		resp, b := post(t, url, body)
		return resp.StatusCode, resp.Header.Get("X-Warmroute-Backend"), b
	}
	may := func(model, backend string) bool {
		return backend == ids[5] || slices.Contains(serves[backend], model)
	}
	for _, model := range []string{"llama", "qwen", "llama-sql-lora"} {
		used := map[string]bool{}
		for i := 0; i < 40; i++ {
			prompt := fmt.Sprintf("%s prompt %d", model, i)
			code, b, body := send(model, prompt)
			if code != http.StatusOK || !may(model, b) {
				t.Fatalf("%s: %d on %s (%s)", model, code, b, body)
			}
			if _, again, _ := send(model, prompt); again != b {
				t.Fatalf("%s: one key on %s, then %s", model, b, again)
			}
			used[b] = true
		}
		if model != "llama-sql-lora" && len(used) < 2 {
			t.Fatalf("%s: 40 keys on %d backend(s)", model, len(used))
		}
	}
	// A model no known backend serves goes to the backends not known.
	if code, b, _ := send("mistral", "y"); code != http.StatusOK || b != ids[5] {
		t.Fatalf("mistral: %d on %s, want the backend whose models are unknown", code, b)
	}
	// Every backend known: an unknown model is refused.
	serves[ids[5]] = []string{"qwen"}
	h.p.SetModels(serves)
	if code, _, body := send("mistral", "x"); code != http.StatusNotFound || !strings.Contains(string(body), `"code":"model_not_found"`) || !strings.Contains(string(body), "mistral") {
		t.Fatalf("unknown model: %d %s", code, body)
	}
	if code, _, _ := send("", "no model"); code != http.StatusOK {
		t.Fatalf("no model: %d", code)
	}
	hits := func() (n int64) {
		for _, s := range stubs {
			n += s.hits.Load()
		}
		return n
	}
	before := hits()
	resp, err := http.Get(h.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK || list.Object != "list" {
		t.Fatalf("/v1/models: %d %v %+v", resp.StatusCode, err, list)
	}
	var got []string
	for _, d := range list.Data {
		got = append(got, d.ID)
	}
	if want := []string{"llama", "llama-sql-lora", "qwen"}; !slices.Equal(got, want) {
		t.Fatalf("/v1/models lists %v, want %v", got, want)
	}
	if hits() != before {
		t.Fatal("/v1/models reached a backend")
	}
	// Forgotten models: back to one fleet.
	h.p.SetModels(nil)
	if code, _, _ := send("mistral", "x"); code != http.StatusOK {
		t.Fatalf("no models known: %d", code)
	}
}
