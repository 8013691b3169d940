package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// LoRA adapters end to end: `warmroute gpusim` instances serving
// different adapters (as vLLM serves them) behind the real router. Before
// gpusim served adapters (114309c), none of this could be tried: its
// flags did not exist.

// startLoRAFleet runs `warmroute gpusim` with n fast instances on free
// loopback ports, extra flags and environment, and returns their URLs.
func startLoRAFleet(t *testing.T, n int, env []string, extra ...string) []string {
	t.Helper()
	a := proc.GpusimArgs{Instances: n, Listen: "127.0.0.1:0", TimeScale: 0.01, Extra: extra}
	p, err := proc.Start(proc.Spec{Name: "gpusim", Path: binPath, Args: a.Args(), Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	var urls []string
	if err := p.WaitReady(context.Background(), 15*time.Second, func(context.Context) error {
		urls = urls[:0]
		for _, m := range gpusimURLs.FindAllStringSubmatch(p.Logs(), -1) {
			urls = append(urls, m[1])
		}
		if len(urls) < n {
			return errors.New("not every address printed yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("gpusim %q: %v", a.Args(), err)
	}
	return urls
}

// loraPost sends a chat request for model with prompt to url and returns
// the status, the router's backend header and the body.
func loraPost(t *testing.T, url, model, prompt string) (int, string, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Warmroute-Backend"), string(b)
}

// waitModelsLearned waits until the router refuses a model no backend
// serves, which it does once it knows every backend's models.
func waitModelsLearned(t *testing.T, r *router) {
	t.Helper()
	if _, err := proc.Poll(t.Context(), 30*time.Second, 50*time.Millisecond, func() (bool, error) {
		code, _, body := loraPost(t, r.url, "no-such-adapter", "x")
		return code == http.StatusNotFound && strings.Contains(body, `"code":"model_not_found"`), r.Alive()
	}); err != nil {
		t.Fatalf("the router never learned what its backends serve: %v", err)
	}
}

// TestE2ELoRAAdaptersRoutedToTheirInstances: four gpusim instances, two
// serving adapter sql, one serving adapter chat, one only the base model.
// The router learns each instance's adapters from its /v1/models and
// sends each adapter's requests only to the instances serving it, each
// answered by that adapter; /v1/models lists the adapters.
func TestE2ELoRAAdaptersRoutedToTheirInstances(t *testing.T) {
	t.Parallel()
	needBinary(t)
	urls := startLoRAFleet(t, 4, nil, "--enable-lora", "--max-loras", "2",
		"--instance-lora-modules", "0:sql=/adapters/sql", "1:sql=/adapters/sql", `2:{"name":"chat","path":"/adapters/chat"}`)
	ids := make([]string, len(urls))
	for i, u := range urls {
		ids[i] = strings.TrimPrefix(u, "http://")
	}
	// Each instance lists its adapters with the base model as parent.
	var models struct {
		Data []struct {
			ID, Root string
			Parent   *string
		}
	}
	resp, err := http.Get(urls[2] + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 2 || models.Data[1].ID != "chat" || models.Data[1].Root != "/adapters/chat" ||
		models.Data[1].Parent == nil || *models.Data[1].Parent != gpusimModel {
		t.Fatalf("instance 2's models: %+v %v", models, err)
	}

	r := startRouter(t, proc.ServeArgs{Backends: urls})
	waitModelsLearned(t, r)
	served := map[string][]string{"sql": ids[:2], "chat": ids[2:3], gpusimModel: ids}
	seen := map[string]map[string]int{}
	for _, model := range []string{"sql", "chat", gpusimModel} {
		seen[model] = map[string]int{}
		for i := 0; i < 24; i++ {
			code, b, body := loraPost(t, r.url, model, fmt.Sprintf("question %d for %s: %s", i, model, strings.Repeat("context ", 40)))
			if code != http.StatusOK || !slices.Contains(served[model], b) || !strings.Contains(body, fmt.Sprintf(`"model":%q`, model)) {
				t.Fatalf("%s: %d from %s (serving it: %v): %s", model, code, b, served[model], body)
			}
			seen[model][b]++
		}
	}
	t.Logf("requests per backend: %v", seen)
	if len(seen[gpusimModel]) < 2 {
		t.Fatalf("the base model's requests all went to one instance: %v", seen[gpusimModel])
	}

	resp, err = http.Get(r.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var got []string
	for _, d := range list.Data {
		got = append(got, d.ID)
	}
	if want := []string{"chat", gpusimModel, "sql"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("router's /v1/models: %v %v, want %v", got, err, want)
	}
	// An adapter no instance serves is the router's 404.
	if code, _, body := loraPost(t, r.url, "sql-v2", "x"); code != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Fatalf("unknown adapter: %d %s", code, body)
	}
}

// TestE2ELoRARuntimeLoadRouted: gpusim started with vLLM's
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=true. Adapter chat is on instance 0
// only; loading it on instance 1 at run time makes the router route chat
// there too once its models polls have seen the new list, and never to
// instance 2.
func TestE2ELoRARuntimeLoadRouted(t *testing.T) {
	t.Parallel()
	needBinary(t)
	urls := startLoRAFleet(t, 3, []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"},
		"--enable-lora", "--instance-lora-modules", "0:chat=/adapters/chat")
	ids := make([]string, len(urls))
	for i, u := range urls {
		ids[i] = strings.TrimPrefix(u, "http://")
	}
	r := startRouter(t, proc.ServeArgs{Backends: urls})
	waitModelsLearned(t, r)
	for i := 0; i < 8; i++ {
		if code, b, body := loraPost(t, r.url, "chat", fmt.Sprintf("before the load %d", i)); code != http.StatusOK || b != ids[0] {
			t.Fatalf("chat before the load: %d from %s: %s", code, b, body)
		}
	}

	resp, err := http.Post(urls[1]+"/v1/load_lora_adapter", "application/json",
		strings.NewReader(`{"lora_name":"chat","lora_path":"/adapters/chat"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "Success: LoRA adapter 'chat' added successfully." {
		t.Fatalf("runtime load: %d %s", resp.StatusCode, b)
	}
	// A request every 100 ms: the router polls models every 10 s.
	i := 0
	took, err := proc.Poll(t.Context(), 60*time.Second, 100*time.Millisecond, func() (bool, error) {
		i++
		code, b, body := loraPost(t, r.url, "chat", fmt.Sprintf("after the load %d", i))
		if code != http.StatusOK || (b != ids[0] && b != ids[1]) {
			t.Fatalf("chat after the load: %d from %s: %s", code, b, body)
		}
		return b == ids[1], r.Alive()
	})
	if err != nil {
		t.Fatalf("chat never routed to the instance that loaded it: %v", err)
	}
	t.Logf("chat first routed to instance 1 %v after the load (%d requests)", took.Round(time.Millisecond), i)
	// From now on chat is spread over instances 0 and 1, never 2.
	n := map[string]int{}
	for j := 0; j < 40; j++ {
		code, b, body := loraPost(t, r.url, "chat", fmt.Sprintf("spread %d", j))
		if code != http.StatusOK || (b != ids[0] && b != ids[1]) {
			t.Fatalf("chat: %d from %s: %s", code, b, body)
		}
		n[b]++
	}
	if n[ids[0]] == 0 || n[ids[1]] == 0 {
		t.Fatalf("chat not spread over both instances serving it: %v", n)
	}
}
