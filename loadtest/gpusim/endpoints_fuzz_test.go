package gpusim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hello","instructions":"be brief","max_output_tokens":5,"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image"}]},{"type":"function_call","name":"f"}]}`,
		`{"input":[{"role":"assistant","content":null},{"role":"user","content":"x"}],"tools":[],"tool_choice":"none","metadata":{"k":"v"}}`,
		`{"input":"x","previous_response_id":"resp_1"}`, `{"input":[1]}`, `{"input":[null]}`, `{"input":{}}`,
		`{"input":"x","instructions":null,"tools":null,"max_output_tokens":-1}`, `{}`, `null`, ``, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseRequest(body, endpointResponses, 4, nil)
		if err != nil {
			if err.status < 400 || err.status > 499 || err.typ == "" || err.message == "" {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if len(p.text) == 0 || !p.chat || p.resp == nil || p.resp.tools == nil || p.resp.toolChoice == nil {
			t.Fatalf("accepted request %+v", p)
		}
		if p.limited && p.maxTokens < 1 {
			t.Fatalf("accepted max_output_tokens %d", p.maxTokens)
		}
		if !bytes.HasSuffix(p.text, []byte("<|assistant|>\n")) {
			t.Fatalf("rendered %q", p.text)
		}
	})
}

// FuzzDirectEndpoints sends a body to each endpoint answered without the
// engine: every answer is 200 or an OpenAI error of 400, 404 or 413, and
// none is larger than the bounds allow.
func FuzzDirectEndpoints(f *testing.F) {
	cfg := FastConfig()
	cfg.Overhead = 0
	cfg.MaxModelLen = 4096
	cfg.MaxRequestBytes = 1 << 20
	in, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { in.Close() })
	paths := []string{"/v1/embeddings", "/v1/rerank", "/v1/score", "/tokenize", "/detokenize", "/v1/audio/transcriptions"}
	for _, s := range []string{
		`{"input":["a","b"],"encoding_format":"base64","dimensions":4}`, `{"input":[[1,2],[3]]}`, `{"input":[1,2,3]}`,
		`{"query":"q","documents":["a","q"],"top_n":1}`, `{"text_1":["a","b"],"text_2":["c","d"]}`, `{"text_1":"a","text_2":"b"}`,
		`{"prompt":"hello","return_token_strs":true}`, `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}`,
		`{"tokens":[0,1,128255]}`, `{"tokens":[-1]}`, `{"input":[]}`, `{}`, `[]`, `null`, ``,
		"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nRIFF\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n",
	} {
		for i := range paths {
			f.Add([]byte(s), byte(i))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, which byte) {
		path := paths[int(which)%len(paths)]
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=b")
		w := httptest.NewRecorder()
		in.ServeHTTP(w, req)
		switch w.Code {
		case http.StatusOK:
			if w.Body.Len() > 4<<20 {
				t.Fatalf("%s: answer of %d bytes", path, w.Body.Len())
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
			if !bytes.HasPrefix(w.Body.Bytes(), []byte(`{"error":{"message":`)) {
				t.Fatalf("%s: error body %s", path, w.Body.Bytes())
			}
		default:
			t.Fatalf("%s: status %d %s", path, w.Code, w.Body.Bytes())
		}
	})
}
