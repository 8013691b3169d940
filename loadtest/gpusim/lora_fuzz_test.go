package gpusim

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzParseLoRAModule: an entry parses or gives ErrBadLoRAModule, and a
// parsed name=path entry is its two halves.
func FuzzParseLoRAModule(f *testing.F) {
	for _, s := range []string{
		"sql=/adapters/sql", `{"name":"a","path":"/p","base_model_name":"m"}`, `{"name":"a"}`, "a=b=c", "a,b=c",
		`{"name":"a","path":"/p"}{}`, `{"name":1}`, "", "=", "{", `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseLoRAModule(s)
		if err != nil {
			if !errors.Is(err, ErrBadLoRAModule) {
				t.Fatalf("%q: error %v does not wrap ErrBadLoRAModule", s, err)
			}
			return
		}
		if strings.Contains(s, "=") && !strings.Contains(s, ",") && m.Name+"="+m.Path != s {
			t.Fatalf("%q parsed as %+v", s, m)
		}
	})
}

// FuzzLoRAEndpoints sends a body to the runtime load and unload
// endpoints: every answer is the success line or a vLLM error of 400, 404
// or 415, and the instance never serves more than MaxLoRAAdapters
// adapters or one with a name a router would not accept.
func FuzzLoRAEndpoints(f *testing.F) {
	cfg := FastConfig()
	cfg.EnableLoRA = true
	cfg.AllowRuntimeLoRAUpdating = true
	cfg.LoRALoadTime = 0
	in, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { in.Close() })
	for _, s := range []string{
		`{"lora_name":"a","lora_path":"/a"}`, `{"lora_name":"a","lora_path":"/b","load_inplace":true}`, `{"lora_name":"a"}`,
		`{"lora_name":"","lora_path":""}`, `{"lora_name":"a","lora_int_id":1}`, `{"lora_name":null}`, `{}`, `[]`, `null`, ``,
		`{"lora_name":"\u0000","lora_path":"/x"}`, `{"lora_name":"a","lora_path":"/x\u007f"}`,
	} {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), true, true)
	}
	f.Fuzz(func(t *testing.T, body []byte, unload, plain bool) {
		path := "/v1/load_lora_adapter"
		if unload {
			path = "/v1/unload_lora_adapter"
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if plain {
			req.Header.Set("Content-Type", "text/plain")
		}
		w := httptest.NewRecorder()
		in.ServeHTTP(w, req)
		switch w.Code {
		case http.StatusOK:
			if !bytes.HasPrefix(w.Body.Bytes(), []byte("Success: LoRA adapter '")) {
				t.Fatalf("%s: 200 with %q", path, w.Body.Bytes())
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusUnsupportedMediaType:
			if !bytes.HasPrefix(w.Body.Bytes(), []byte(`{"error":{"message":`)) {
				t.Fatalf("%s: error body %s", path, w.Body.Bytes())
			}
		default:
			t.Fatalf("%s: status %d %s", path, w.Code, w.Body.Bytes())
		}
		ads := in.LoRAAdapters()
		if len(ads) > MaxLoRAAdapters {
			t.Fatalf("%d adapters", len(ads))
		}
		for _, a := range ads {
			if checkLoRAName(a) != "" {
				t.Fatalf("serves adapter %q", a)
			}
		}
	})
}
