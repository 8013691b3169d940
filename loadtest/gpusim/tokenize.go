package gpusim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []int     `json:"tokens"`
	TokenStrs   *[]string `json:"token_strs"`
}

// tokenize answers POST /tokenize: `prompt` (a string) or `messages`
// (rendered as chat renders them, with the generation prompt unless
// add_generation_prompt is false), cut into tokens as the engine cuts
// prompts, so count is the prompt_tokens the same prompt reports on
// /v1/completions or /v1/chat/completions. A token's id is a hash of its
// bytes below VocabSize.
func (in *Instance) tokenize(body []byte) (any, *apiError) {
	var req struct {
		Model               string         `json:"model"`
		Prompt              *string        `json:"prompt"`
		Messages            *[]chatMessage `json:"messages"`
		AddGenerationPrompt *bool          `json:"add_generation_prompt"`
		ReturnTokenStrs     bool           `json:"return_token_strs"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, validationError("JSON decode error: %v", err)
	}
	var text []byte
	switch {
	case req.Messages != nil:
		msgs := *req.Messages
		for i := range msgs {
			if msgs[i].Role == "" {
				return nil, validationError("messages.%d.role: Field required", i)
			}
		}
		text = appendChat(nil, msgs)
		if req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt {
			text = bytes.TrimSuffix(text, []byte("<|assistant|>\n"))
		}
	case req.Prompt != nil:
		text = []byte(*req.Prompt)
	default:
		return nil, validationError("prompt: Field required")
	}
	if _, aerr := in.checkModel(req.Model); aerr != nil {
		return nil, aerr
	}
	n := in.tokens(text)
	if n > in.cfg.MaxModelLen {
		return nil, in.tooLong(n, "tokenization")
	}
	res := tokenizeResponse{Count: n, MaxModelLen: in.cfg.MaxModelLen, Tokens: make([]int, n)}
	unit := in.cfg.BytesPerToken
	var strs []string
	if req.ReturnTokenStrs {
		strs = make([]string, n)
		res.TokenStrs = &strs
	}
	for i := range res.Tokens {
		chunk := text[i*unit : min((i+1)*unit, len(text))]
		res.Tokens[i] = int(xxhash.Sum64(chunk) % VocabSize)
		if strs != nil {
			strs[i] = string(chunk) // bytes that are not UTF-8 become U+FFFD in the JSON
		}
	}
	return res, nil
}

// detokenize answers POST /detokenize: each id below VocabSize is a
// word of the filler vocabulary (as generated text is), so any list of
// valid ids decodes, deterministically.
func (in *Instance) detokenize(body []byte) (any, *apiError) {
	var req struct {
		Model  string   `json:"model"`
		Tokens *[]int64 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, validationError("JSON decode error: %v", err)
	}
	if req.Tokens == nil {
		return nil, validationError("tokens: Field required")
	}
	ids := *req.Tokens
	if _, aerr := in.checkModel(req.Model); aerr != nil {
		return nil, aerr
	}
	if len(ids) > in.cfg.MaxModelLen {
		return nil, in.tooLong(len(ids), "detokenization")
	}
	var sb strings.Builder
	for i, id := range ids {
		if id < 0 || id >= VocabSize {
			return nil, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "tokens",
				message: fmt.Sprintf("token id %d at index %d is out of vocabulary (0-%d).", id, i, VocabSize-1)}
		}
		w := in.fill.words[id%64]
		if i > 0 {
			w = in.fill.spaced[id%64]
		}
		sb.WriteString(w)
	}
	return struct {
		Prompt string `json:"prompt"`
	}{sb.String()}, nil
}
