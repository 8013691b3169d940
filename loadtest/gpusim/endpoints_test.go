package gpusim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

func norm(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

func TestEmbeddings(t *testing.T) {
	ts := startInstance(t, FastConfig())
	type resp struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Index     int       `json:"index"`
			Object    string    `json:"object"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage usage `json:"usage"`
	}
	res, b := ts.do(t, "POST", "/v1/embeddings", `{"model":"meta-llama/Llama-3.1-70B-Instruct","input":["hello world!","other text"]}`)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	e := decode[resp](t, b)
	if e.Object != "list" || len(e.Data) != 2 || e.Data[1].Index != 1 || e.Data[0].Object != "embedding" ||
		len(e.Data[0].Embedding) != EmbeddingDims || math.Abs(norm(e.Data[0].Embedding)-1) > 1e-5 || e.Usage.PromptTokens != 3+3 {
		t.Fatalf("embeddings %s", b)
	}
	// The same text gets the same vector, as a string or in a list.
	_, b2 := ts.do(t, "POST", "/v1/embeddings", `{"input":"hello world!","dimensions":8}`)
	e2 := decode[resp](t, b2)
	if len(e2.Data) != 1 || len(e2.Data[0].Embedding) != 8 || math.Abs(norm(e2.Data[0].Embedding)-1) > 1e-5 ||
		math.Abs(e2.Data[0].Embedding[0]/e.Data[0].Embedding[0]-e2.Data[0].Embedding[1]/e.Data[0].Embedding[1]) > 1e-4 {
		t.Fatalf("dimensions 8: %s vs %s", b2, b)
	}
	_, b3 := ts.do(t, "POST", "/v1/embeddings", `{"input":[[1,2,3],[4]]}`)
	if e3 := decode[resp](t, b3); len(e3.Data) != 2 || e3.Usage.PromptTokens != 4 {
		t.Fatalf("token ids: %s", b3)
	}
	_, b4 := ts.do(t, "POST", "/v1/embeddings", `{"input":"hello world!","encoding_format":"base64"}`)
	var raw struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if json.Unmarshal(b4, &raw) != nil || len(raw.Data) != 1 || len(raw.Data[0].Embedding) != (EmbeddingDims*4+2)/3*4 {
		t.Fatalf("base64: %s", b4)
	}
}

func TestDirectEndpointErrors(t *testing.T) {
	cfg := FastConfig()
	cfg.MaxModelLen = 100
	ts := startInstance(t, cfg)
	many := "[" + strings.Repeat(`"a",`, MaxBatchInputs) + `"a"]`
	for _, c := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/v1/embeddings", `{}`, 400, "input: Field required"},
		{"/v1/embeddings", `{"input":5}`, 400, "Input should be"},
		{"/v1/embeddings", `{"input":[]}`, 400, "cannot be empty"},
		{"/v1/embeddings", `{"input":""}`, 400, "cannot be empty"},
		{"/v1/embeddings", `{"input":` + many + `}`, 400, "at most 2048"},
		{"/v1/embeddings", `{"input":"x","encoding_format":"hex"}`, 400, "encoding_format"},
		{"/v1/embeddings", `{"input":"x","dimensions":33}`, 400, "dimensions"},
		{"/v1/embeddings", `{"input":"x","model":"other"}`, 404, "does not exist"},
		{"/v1/embeddings", `{"input":"` + strings.Repeat("x", 401) + `"}`, 400, "maximum context length is 100"},
		{"/v1/embeddings", `{"input":`, 400, "JSON decode error"},
		{"/v1/rerank", `{"documents":["a"]}`, 400, "query: Field required"},
		{"/rerank", `{"query":"q"}`, 400, "documents: Field required"},
		{"/v2/rerank", `{"query":"q","documents":[{"image":1}]}`, 400, "text only"},
		{"/v1/score", `{"text_2":"a"}`, 400, "text_1: Field required"},
		{"/score", `{"text_1":["a","b"],"text_2":["a","b","c"]}`, 400, "1:1, 1:N or N:N"},
		{"/score", `{"text_1":[],"text_2":["a"]}`, 400, "At least one"},
		{"/tokenize", `{"model":"m"}`, 400, "prompt: Field required"},
		{"/tokenize", `{"prompt":["a"]}`, 400, "JSON decode error"},
		{"/tokenize", `{"messages":[{"content":"x"}]}`, 400, "messages.0.role"},
		{"/detokenize", `{}`, 400, "tokens: Field required"},
		{"/detokenize", `{"tokens":[1,128256]}`, 400, "out of vocabulary"},
		{"/detokenize", `{"tokens":[-1]}`, 400, "out of vocabulary"},
		{"/v1/responses", `{"model":"meta-llama/Llama-3.1-70B-Instruct"}`, 400, "input: Field required"},
		{"/v1/responses", `{"input":{"a":1}}`, 400, "input: Input should be"},
		{"/v1/responses", `{"input":[1]}`, 400, "input.0"},
		{"/v1/responses", `{"input":[{"content":"x"}]}`, 400, "input.0.type: Field required"},
		{"/v1/responses", `{"input":[{"role":"user","content":7}]}`, 400, "input.0.content"},
		{"/v1/responses", `{"input":"x","instructions":3}`, 400, "instructions"},
		{"/v1/responses", `{"input":"x","max_output_tokens":0}`, 400, "max_output_tokens"},
		{"/v1/responses", `{"input":"x","previous_response_id":"resp_1"}`, 404, "not found"},
		{"/v1/responses", `{"input":"` + strings.Repeat("x", 400) + `"}`, 400, "maximum context length"},
		{"/v1/audio/transcriptions", `{"file":"x"}`, 400, "multipart/form-data"},
	} {
		res, b := ts.do(t, "POST", c.path, c.body)
		eb := decode[errorBody](t, b)
		if res.StatusCode != c.status || eb.Error.Code != c.status || !strings.Contains(eb.Error.Message, c.msg) || eb.Error.Type == "" {
			t.Errorf("POST %s %.60s: %d %s, want %d with %q", c.path, c.body, res.StatusCode, b, c.status, c.msg)
		}
	}
	if res, _ := ts.do(t, "GET", "/v1/embeddings", ""); res.StatusCode != 405 || res.Header.Get("Allow") != "POST" {
		t.Fatalf("GET /v1/embeddings: %d", res.StatusCode)
	}
}

func TestRerankScoreTokenize(t *testing.T) {
	ts := startInstance(t, FastConfig())
	res, b := ts.do(t, "POST", "/v1/rerank", `{"query":"capital of France","documents":["cats","capital of France","dogs"],"top_n":2}`)
	var rr struct {
		ID      string `json:"id"`
		Results []struct {
			Index    int `json:"index"`
			Document struct {
				Text string `json:"text"`
			} `json:"document"`
			RelevanceScore float64 `json:"relevance_score"`
		} `json:"results"`
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if res.StatusCode != 200 || json.Unmarshal(b, &rr) != nil || len(rr.Results) != 2 || rr.Results[0].Index != 1 ||
		rr.Results[0].RelevanceScore != 1 || rr.Results[1].RelevanceScore >= 1 || rr.Results[0].Document.Text != "capital of France" ||
		rr.Usage.TotalTokens != 3*5+1+5+1 || !strings.HasPrefix(rr.ID, "rerank-") {
		t.Fatalf("rerank: %d %s", res.StatusCode, b)
	}
	_, b = ts.do(t, "POST", "/score", `{"text_1":"abcd","text_2":["abcd","efgh"]}`)
	var sr struct {
		Object string `json:"object"`
		Data   []struct {
			Index  int     `json:"index"`
			Object string  `json:"object"`
			Score  float64 `json:"score"`
		} `json:"data"`
		Usage usage `json:"usage"`
	}
	if json.Unmarshal(b, &sr) != nil || sr.Object != "list" || len(sr.Data) != 2 || sr.Data[0].Score != 1 ||
		sr.Data[1].Score <= 0 || sr.Data[1].Score >= 1 || sr.Data[1].Object != "score" || sr.Usage.PromptTokens != 4 {
		t.Fatalf("score: %s", b)
	}

	// /tokenize counts what the completions and chat endpoints count.
	type tok struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []int    `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}
	prompt := words("Once upon a time", 203)
	pb, _ := json.Marshal(prompt)
	_, b = ts.do(t, "POST", "/tokenize", `{"prompt":`+string(pb)+`,"return_token_strs":true}`)
	tk := decode[tok](t, b)
	c := ts.postJSON(t, "/v1/completions", `{"prompt":`+string(pb)+`,"max_tokens":1}`)
	if tk.Count != c.Usage.PromptTokens || len(tk.Tokens) != tk.Count || tk.MaxModelLen != 131072 ||
		strings.Join(tk.TokenStrs, "") != prompt {
		t.Fatalf("tokenize %s; completions counted %d", b, c.Usage.PromptTokens)
	}
	for _, id := range tk.Tokens {
		if id < 0 || id >= VocabSize {
			t.Fatalf("token id %d", id)
		}
	}
	_, b = ts.do(t, "POST", "/tokenize", `{"messages":[{"role":"user","content":"hi there"}]}`)
	ch := ts.postJSON(t, "/v1/chat/completions", chatBody("hi there", `,"max_tokens":1`))
	if tk := decode[tok](t, b); tk.Count != ch.Usage.PromptTokens || tk.TokenStrs != nil {
		t.Fatalf("tokenize chat %s; chat counted %d", b, ch.Usage.PromptTokens)
	}
	_, b = ts.do(t, "POST", "/detokenize", `{"tokens":[5,70,128255]}`)
	var dt struct {
		Prompt string `json:"prompt"`
	}
	if json.Unmarshal(b, &dt) != nil || len(strings.Fields(dt.Prompt)) != 3 || dt.Prompt[0] == ' ' {
		t.Fatalf("detokenize %s", b)
	}
}

func multipartBody(t *testing.T, fields map[string]string, file []byte) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for k, v := range fields {
		mw.WriteField(k, v)
	}
	if file != nil {
		fw, err := mw.CreateFormFile("file", "a.wav")
		if err != nil {
			t.Fatal(err)
		}
		fw.Write(file)
	}
	mw.Close()
	return mw.FormDataContentType(), buf.Bytes()
}

func TestAudio(t *testing.T) {
	ts := startInstance(t, FastConfig())
	post := func(path, ct string, body []byte) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", ts.srv.URL+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		res, err := ts.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out bytes.Buffer
		out.ReadFrom(res.Body)
		return res, out.Bytes()
	}
	audio := bytes.Repeat([]byte{0, 1, 2, 0xff}, 2500) // 10,000 bytes: 5 words
	ct, body := multipartBody(t, map[string]string{"model": "meta-llama/Llama-3.1-70B-Instruct", "language": "en"}, audio)
	res, b := post("/v1/audio/transcriptions", ct, body)
	var tr struct {
		Text string `json:"text"`
	}
	if res.StatusCode != 200 || json.Unmarshal(b, &tr) != nil || len(strings.Fields(tr.Text)) != 5 {
		t.Fatalf("transcription %d %s", res.StatusCode, b)
	}
	ct, body = multipartBody(t, map[string]string{"response_format": "text"}, audio)
	res, b = post("/v1/audio/translations", ct, body)
	if res.StatusCode != 200 || string(b) != tr.Text || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("translation as text %d %q, want %q", res.StatusCode, b, tr.Text)
	}
	for _, c := range []struct {
		fields map[string]string
		file   []byte
		msg    string
	}{
		{map[string]string{"model": "x"}, nil, "file: Field required"},
		{nil, []byte{}, "empty"},
		{map[string]string{"response_format": "srt"}, audio, "response_format"},
		{map[string]string{"stream": "true"}, audio, "stream"},
		{map[string]string{"model": "x"}, audio, "does not exist"},
		{map[string]string{"prompt": strings.Repeat("x", maxFormField+1)}, audio, "exceeds"},
	} {
		ct, body := multipartBody(t, c.fields, c.file)
		res, b := post("/v1/audio/transcriptions", ct, body)
		if res.StatusCode/100 != 4 || !strings.Contains(string(b), c.msg) {
			t.Errorf("%v: %d %s, want %q", c.fields, res.StatusCode, b, c.msg)
		}
	}
	res, b = post("/v1/audio/transcriptions", "multipart/form-data; boundary=xyz", []byte("--xyz\r\nbroken"))
	if res.StatusCode != 400 {
		t.Fatalf("broken multipart: %d %s", res.StatusCode, b)
	}
}

func TestResponsesAPI(t *testing.T) {
	ts := startInstance(t, FastConfig())
	client := openaiClient(ts)
	ctx := t.Context()
	instructions := words("You are a support bot. Policy:", 3000)
	params := responses.ResponseNewParams{
		Model:           "meta-llama/Llama-3.1-70B-Instruct",
		Instructions:    openai.String(instructions),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("How do I reset my password?")},
		MaxOutputTokens: openai.Int(12),
	}
	res, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatalf("responses: %v", err)
	}
	// The prompt is rendered as chat renders the same messages.
	wantPrompt := int64((len("<|system|>\n"+instructions+"<|eot|>\n<|user|>\nHow do I reset my password?<|eot|>\n<|assistant|>\n") + 3) / 4)
	if !strings.HasPrefix(res.ID, "resp_") || res.Object != "response" || res.Status != "incomplete" ||
		res.IncompleteDetails.Reason != "max_output_tokens" || len(strings.Fields(res.OutputText())) != 12 ||
		res.Usage.InputTokens != wantPrompt || res.Usage.OutputTokens != 12 || res.Usage.TotalTokens != wantPrompt+12 ||
		res.Usage.InputTokensDetails.CachedTokens != 0 || res.Instructions.OfString != instructions ||
		len(res.Output) != 1 || res.Output[0].Role != "assistant" || res.Output[0].Status != "completed" {
		t.Fatalf("response %s", res.RawJSON())
	}
	chat := ts.postJSON(t, "/v1/chat/completions", `{"max_tokens":12,"messages":[{"role":"system","content":`+
		string(must(json.Marshal(instructions)))+`},{"role":"user","content":"How do I reset my password?"}]}`)
	if int64(chat.Usage.PromptTokens) != wantPrompt || chat.Choices[0].Message.Content != res.OutputText() ||
		int64(chat.Usage.PromptTokensDetails.CachedTokens) != (wantPrompt-1)/16*16 {
		t.Fatalf("the same conversation as chat: %+v", chat)
	}

	// Streaming, without a limit: the events in order, then completed.
	params = responses.ResponseNewParams{Model: params.Model, Instructions: params.Instructions, Input: params.Input}
	stream := client.Responses.NewStreaming(ctx, params)
	var types []string
	var text strings.Builder
	var final responses.Response
	for stream.Next() {
		ev := stream.Current()
		if n := len(types); ev.SequenceNumber != int64(n) {
			t.Fatalf("event %d has sequence number %d", n, ev.SequenceNumber)
		}
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	head := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added", "response.output_text.delta"}
	tail := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if len(types) < len(head)+len(tail) || strings.Join(types[:len(head)], " ") != strings.Join(head, " ") ||
		strings.Join(types[len(types)-len(tail):], " ") != strings.Join(tail, " ") {
		t.Fatalf("events %v", types)
	}
	if final.Status != "completed" || final.OutputText() != text.String() || len(strings.Fields(text.String())) != 64 ||
		final.Usage.InputTokensDetails.CachedTokens != (wantPrompt-1)/16*16 || !strings.HasPrefix(text.String(), res.OutputText()) {
		t.Fatalf("final %s; streamed %q", final.RawJSON(), text.String())
	}

	// Input items: messages with parts, and a function call.
	_, b := ts.do(t, "POST", "/v1/responses", `{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"b"}]},`+
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}],"max_output_tokens":2,"tools":[{"type":"function","name":"f"}]}`)
	var ro struct {
		Status string          `json:"status"`
		Tools  json.RawMessage `json:"tools"`
		Usage  struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	rendered := "<|user|>\na\nb<|eot|>\n<|function_call|>\n{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"}<|eot|>\n<|assistant|>\n"
	if json.Unmarshal(b, &ro) != nil || ro.Usage.InputTokens != (len(rendered)+3)/4 || !strings.Contains(string(ro.Tools), `"name":"f"`) {
		t.Fatalf("items: %s", b)
	}
	hashes, n, err := PromptBlocks("/v1/responses", []byte(`{"input":"x","instructions":"y"}`), 4, 16)
	chashes, cn, _ := PromptBlocks("/v1/chat/completions", []byte(`{"messages":[{"role":"system","content":"y"},{"role":"user","content":"x"}]}`), 4, 16)
	if err != nil || n != cn || len(hashes) != len(chashes) {
		t.Fatalf("PromptBlocks: %d %d %v", n, cn, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The raw stream is SSE with an event line per event.
func TestResponsesStreamWire(t *testing.T) {
	ts := startInstance(t, FastConfig())
	req, _ := http.NewRequest("POST", ts.srv.URL+"/v1/responses", strings.NewReader(`{"input":"hi","stream":true,"max_output_tokens":3}`))
	res, err := ts.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	var event string
	n := 0
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var v struct {
				Type string `json:"type"`
			}
			if json.Unmarshal([]byte(line[6:]), &v) != nil || v.Type != event {
				t.Fatalf("data %q after event %q", line, event)
			}
			n++
		case line != "":
			t.Fatalf("line %q", line)
		}
	}
	if event != "response.incomplete" || n < 9 {
		t.Fatalf("last event %q after %d", event, n)
	}
}

func TestDirectEndpointsTooLarge(t *testing.T) {
	cfg := FastConfig()
	cfg.MaxRequestBytes = 4096
	ts := startInstance(t, cfg)
	ct, body := multipartBody(t, map[string]string{"model": "m"}, bytes.Repeat([]byte{1}, 8192))
	req, _ := http.NewRequest("POST", ts.srv.URL+"/v1/audio/transcriptions", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	res, err := ts.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("audio over the limit: %d", res.StatusCode)
	}
	if res, b := ts.do(t, "POST", "/v1/embeddings", `{"input":"`+strings.Repeat("x", 5000)+`"}`); res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("embeddings over the limit: %d %s", res.StatusCode, b)
	}
}
