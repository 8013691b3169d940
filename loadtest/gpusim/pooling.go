package gpusim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// The endpoints answered without the engine: embeddings, score, rerank,
// tokenize, detokenize (here) and audio (audio.go). Each reads a bounded
// body, validates it as vLLM does, applies the injected faults, waits the
// scaled Overhead and answers at once: deterministic output from the
// input, no KV cache, no metrics.

const (
	// EmbeddingDims is the length of an embedding vector (a request's
	// `dimensions` may ask for fewer).
	EmbeddingDims = 32
	// MaxBatchInputs bounds the inputs of one embeddings request, the
	// documents of one rerank and the pairs of one score (OpenAI's limit
	// on an embeddings input array).
	MaxBatchInputs = 2048
	// VocabSize is the simulated tokenizer's vocabulary (Llama 3's):
	// /tokenize's ids are below it, /detokenize refuses ids that are not.
	VocabSize = 128256
)

// answer is a 200 body that is not JSON (a transcription as text).
type answer struct {
	contentType string
	body        []byte
}

// serveDirect runs an endpoint answered without the engine: handle reads
// and validates the request and returns the 200 answer (a value to encode
// as JSON, or an answer) or the error.
func (in *Instance) serveDirect(w http.ResponseWriter, r *http.Request, handle func(http.ResponseWriter, *http.Request) (any, *apiError)) {
	if in.isClosed() {
		writeError(w, unavailable())
		return
	}
	v, aerr := handle(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if !in.admit(r.Context(), w) {
		return
	}
	if a, ok := v.(answer); ok {
		w.Header().Set("Content-Type", a.contentType)
		_, _ = w.Write(a.body)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// serveBody is serveDirect for an endpoint that takes its whole body
// (read with readBody).
func (in *Instance) serveBody(w http.ResponseWriter, r *http.Request, handle func([]byte) (any, *apiError)) {
	in.serveDirect(w, r, func(w http.ResponseWriter, r *http.Request) (any, *apiError) {
		body, aerr := in.readBody(w, r)
		if aerr != nil {
			return nil, aerr
		}
		return handle(body)
	})
}

// readBody reads a request body of at most Config.MaxRequestBytes.
func (in *Instance) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, in.cfg.MaxRequestBytes))
	if err != nil {
		return nil, bodyError(err)
	}
	return body, nil
}

func bodyError(err error) *apiError {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError",
			message: fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit)}
	}
	return badRequest("reading request body: %v", err)
}

// checkModel refuses a model name the instance does not serve, and
// returns the name the answer gives (the base model's, or the adapter's
// it names; a pooling answer does not depend on the adapter).
func (in *Instance) checkModel(model string) ([]byte, *apiError) {
	_, modelJSON, aerr := in.modelFor(model)
	return modelJSON, aerr
}

// tokens is the length in tokens of text at the instance's bytes per token.
func (in *Instance) tokens(text []byte) int {
	return (len(text) + in.cfg.BytesPerToken - 1) / in.cfg.BytesPerToken
}

func (in *Instance) tooLong(n int, what string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "input_tokens",
		message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input for %s. "+
			"Please reduce the length of the input.", in.cfg.MaxModelLen, n, what)}
}

// poolInput is one text to embed or score: its rendered bytes (token ids
// as appendTokenIDs renders them) and its length in tokens.
type poolInput struct {
	text   []byte
	tokens int
}

// embedding returns the unit vector of text: dims pseudo-random
// components seeded by its hash, so the same text always gets the same
// vector and different texts nearly orthogonal ones.
func embedding(text []byte, dims int) []float32 {
	seed := xxhash.Sum64(text)
	v := make([]float32, dims)
	for i := range v {
		seed += 0x9e3779b97f4a7c15 // splitmix64
		z := seed
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		v[i] = float32(float64(z>>11)/(1<<52) - 1) // [-1, 1)
	}
	normalize(v)
	return v
}

// similarity is a relevance score in [0, 1] of two texts: the cosine of
// their embeddings mapped from [-1, 1]; a text scores 1 with itself.
func similarity(a, b []byte) float64 {
	va, vb := embedding(a, EmbeddingDims), embedding(b, EmbeddingDims)
	var dot float64
	for i := range va {
		dot += float64(va[i]) * float64(vb[i])
	}
	return math.Max(0, math.Min(1, (dot+1)/2))
}

// parseInputs reads an embeddings `input`: a string, a list of strings, a
// list of token ids, or a list of lists of token ids.
func parseInputs(raw json.RawMessage, field string) ([]poolInput, *apiError) {
	if !isPresent(raw) {
		return nil, validationError("%s: Field required", field)
	}
	raw = bytes.TrimLeft(raw, " \t\r\n")
	invalid := validationError("%s: Input should be a valid string, list of strings or list of token ids", field)
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, invalid
		}
		return []poolInput{{text: []byte(s)}}, nil
	}
	if raw[0] != '[' {
		return nil, invalid
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, invalid
	}
	if len(items) == 0 {
		return nil, badRequest("%s cannot be empty.", field)
	}
	switch items[0][0] {
	case '"':
		var ss []string
		if json.Unmarshal(raw, &ss) != nil {
			return nil, invalid
		}
		if len(ss) > MaxBatchInputs {
			return nil, tooMany(field, len(ss))
		}
		out := make([]poolInput, len(ss))
		for i, s := range ss {
			out[i].text = []byte(s)
		}
		return out, nil
	case '[':
		var lists [][]int64
		if json.Unmarshal(raw, &lists) != nil {
			return nil, invalid
		}
		if len(lists) > MaxBatchInputs {
			return nil, tooMany(field, len(lists))
		}
		out := make([]poolInput, len(lists))
		for i, ids := range lists {
			out[i] = poolInput{text: appendTokenIDs(nil, ids), tokens: len(ids)}
		}
		return out, nil
	default:
		var ids []int64
		if json.Unmarshal(raw, &ids) != nil {
			return nil, invalid
		}
		return []poolInput{{text: appendTokenIDs(nil, ids), tokens: len(ids)}}, nil
	}
}

func tooMany(field string, n int) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: field,
		message: fmt.Sprintf("gpusim takes at most %d inputs in %s, got %d.", MaxBatchInputs, field, n)}
}

// countTokens fills in the token counts of text inputs and checks every
// input against the context length; it returns their sum.
func (in *Instance) countTokens(inputs []poolInput, what string) (int, *apiError) {
	sum := 0
	for i := range inputs {
		p := &inputs[i]
		if p.text != nil && p.tokens == 0 {
			p.tokens = in.tokens(p.text)
		}
		if p.tokens == 0 {
			return 0, badRequest("The prompt cannot be empty.")
		}
		if p.tokens > in.cfg.MaxModelLen {
			return 0, in.tooLong(p.tokens, what)
		}
		sum += p.tokens
	}
	return sum, nil
}

// poolUsage is vLLM's UsageInfo of a pooling request.
type poolUsage struct {
	PromptTokens        int              `json:"prompt_tokens"`
	TotalTokens         int              `json:"total_tokens"`
	CompletionTokens    int              `json:"completion_tokens"`
	PromptTokensDetails *json.RawMessage `json:"prompt_tokens_details"`
}

type embeddingData struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingResponse struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   json.RawMessage `json:"model"`
	Data    []embeddingData `json:"data"`
	Usage   poolUsage       `json:"usage"`
}

// embeddings answers POST /v1/embeddings.
func (in *Instance) embeddings(body []byte) (any, *apiError) {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat *string         `json:"encoding_format"`
		Dimensions     *int64          `json:"dimensions"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, validationError("JSON decode error: %v", err)
	}
	inputs, aerr := parseInputs(req.Input, "input")
	if aerr != nil {
		return nil, aerr
	}
	format := "float"
	if req.EncodingFormat != nil {
		format = *req.EncodingFormat
	}
	if format != "float" && format != "base64" {
		return nil, validationError("encoding_format: Input should be 'float' or 'base64'")
	}
	dims := EmbeddingDims
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > EmbeddingDims {
			return nil, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "dimensions",
				message: fmt.Sprintf("dimensions must be between 1 and %d, got %d.", EmbeddingDims, *req.Dimensions)}
		}
		dims = int(*req.Dimensions)
	}
	modelJSON, aerr := in.checkModel(req.Model)
	if aerr != nil {
		return nil, aerr
	}
	n, aerr := in.countTokens(inputs, "embedding generation")
	if aerr != nil {
		return nil, aerr
	}
	res := embeddingResponse{ID: randomID("embd-"), Object: "list", Created: time.Now().Unix(), Model: modelJSON,
		Data: make([]embeddingData, len(inputs)), Usage: poolUsage{PromptTokens: n, TotalTokens: n}}
	for i, p := range inputs {
		v := embedding(p.text, EmbeddingDims)
		if dims < EmbeddingDims { // a shorter vector is renormalised, as Matryoshka models' are
			v = v[:dims]
			normalize(v)
		}
		d := embeddingData{Index: i, Object: "embedding", Embedding: v}
		if format == "base64" {
			b := make([]byte, 0, 4*len(v))
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
			d.Embedding = base64.StdEncoding.EncodeToString(b)
		}
		res.Data[i] = d
	}
	return res, nil
}

func normalize(v []float32) {
	var norm float64
	for _, x := range v {
		norm += float64(x) * float64(x)
	}
	if norm == 0 {
		v[0], norm = 1, 1
	}
	inv := 1 / math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) * inv)
	}
}

// textList reads a score text: a string or a list of strings.
func textList(raw json.RawMessage, field string) ([]poolInput, *apiError) {
	if !isPresent(raw) {
		return nil, validationError("%s: Field required", field)
	}
	raw = bytes.TrimLeft(raw, " \t\r\n")
	var ss []string
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, validationError("%s: Input should be a valid string", field)
		}
		ss = []string{s}
	} else if json.Unmarshal(raw, &ss) != nil {
		return nil, validationError("%s: Input should be a valid string or list of strings (gpusim scores text only)", field)
	}
	if len(ss) > MaxBatchInputs {
		return nil, tooMany(field, len(ss))
	}
	out := make([]poolInput, len(ss))
	for i, s := range ss {
		out[i].text = []byte(s)
	}
	return out, nil
}

type scoreData struct {
	Index  int     `json:"index"`
	Object string  `json:"object"`
	Score  float64 `json:"score"`
}

type scoreResponse struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   json.RawMessage `json:"model"`
	Data    []scoreData     `json:"data"`
	Usage   poolUsage       `json:"usage"`
}

// score answers POST /v1/score and /score: text_1 against each of
// text_2 (1:1, 1:N or N:N).
func (in *Instance) score(body []byte) (any, *apiError) {
	var req struct {
		Model string          `json:"model"`
		Text1 json.RawMessage `json:"text_1"`
		Text2 json.RawMessage `json:"text_2"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, validationError("JSON decode error: %v", err)
	}
	t1, aerr := textList(req.Text1, "text_1")
	if aerr != nil {
		return nil, aerr
	}
	t2, aerr := textList(req.Text2, "text_2")
	if aerr != nil {
		return nil, aerr
	}
	if len(t1) == 0 || len(t2) == 0 {
		return nil, badRequest("At least one text element must be given")
	}
	if len(t1) > 1 && len(t1) != len(t2) {
		return nil, badRequest("Input lengths must be either 1:1, 1:N or N:N")
	}
	modelJSON, aerr := in.checkModel(req.Model)
	if aerr != nil {
		return nil, aerr
	}
	n1, aerr := in.countTokens(t1, "score")
	if aerr != nil {
		return nil, aerr
	}
	n2, aerr := in.countTokens(t2, "score")
	if aerr != nil {
		return nil, aerr
	}
	n := n2
	if len(t1) == 1 {
		n += n1 * len(t2) // the query is read with every document
	} else {
		n += n1
	}
	res := scoreResponse{ID: randomID("score-"), Object: "list", Created: time.Now().Unix(), Model: modelJSON,
		Data: make([]scoreData, len(t2)), Usage: poolUsage{PromptTokens: n, TotalTokens: n}}
	for i := range t2 {
		q := t1[0]
		if len(t1) > 1 {
			q = t1[i]
		}
		res.Data[i] = scoreData{Index: i, Object: "score", Score: similarity(q.text, t2[i].text)}
	}
	return res, nil
}

type rerankResult struct {
	Index    int `json:"index"`
	Document struct {
		Text string `json:"text"`
	} `json:"document"`
	RelevanceScore float64 `json:"relevance_score"`
}

type rerankResponse struct {
	ID    string          `json:"id"`
	Model json.RawMessage `json:"model"`
	Usage struct {
		TotalTokens int `json:"total_tokens"`
	} `json:"usage"`
	Results []rerankResult `json:"results"`
}

// rerank answers POST /v1/rerank, /rerank and /v2/rerank: the
// documents by relevance to the query, best first, the top_n of them
// (all when top_n is 0 or absent).
func (in *Instance) rerank(body []byte) (any, *apiError) {
	var req struct {
		Model     string          `json:"model"`
		Query     *string         `json:"query"`
		Documents json.RawMessage `json:"documents"`
		TopN      int64           `json:"top_n"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, validationError("JSON decode error: %v", err)
	}
	if req.Query == nil {
		return nil, validationError("query: Field required")
	}
	if !isPresent(req.Documents) {
		return nil, validationError("documents: Field required")
	}
	var docs []string
	if json.Unmarshal(req.Documents, &docs) != nil {
		return nil, validationError("documents: Input should be a valid list of strings (gpusim reranks text only)")
	}
	if len(docs) > MaxBatchInputs {
		return nil, tooMany("documents", len(docs))
	}
	modelJSON, aerr := in.checkModel(req.Model)
	if aerr != nil {
		return nil, aerr
	}
	q := []poolInput{{text: []byte(*req.Query)}}
	nq, aerr := in.countTokens(q, "rerank")
	if aerr != nil {
		return nil, aerr
	}
	res := rerankResponse{ID: randomID("rerank-"), Model: modelJSON, Results: make([]rerankResult, len(docs))}
	total := 0
	for i, d := range docs {
		dt := []poolInput{{text: []byte(d)}}
		nd, aerr := in.countTokens(dt, "rerank")
		if aerr != nil {
			return nil, aerr
		}
		total += nq + nd
		res.Results[i].Index = i
		res.Results[i].Document.Text = d
		res.Results[i].RelevanceScore = similarity(q[0].text, dt[0].text)
	}
	slices.SortStableFunc(res.Results, func(a, b rerankResult) int {
		switch {
		case a.RelevanceScore > b.RelevanceScore:
			return -1
		case a.RelevanceScore < b.RelevanceScore:
			return 1
		}
		return 0
	})
	if req.TopN > 0 && req.TopN < int64(len(res.Results)) {
		res.Results = res.Results[:req.TopN]
	}
	res.Usage.TotalTokens = total
	return res, nil
}
