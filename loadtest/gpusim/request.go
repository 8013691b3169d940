package gpusim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// endpoint is the API a request was made to.
type endpoint int

const (
	endpointChat endpoint = iota
	endpointCompletion
	endpointInvocations // resolved to chat or completion by the body
	endpointResponses   // the Responses API, rendered as chat (responses.go)
)

// apiError is an error answered as OpenAI-style JSON, in vLLM's
// ErrorResponse shape: {"error":{"message","type","param","code"}}.
type apiError struct {
	status  int
	typ     string
	message string
	param   string
}

func (e *apiError) Error() string { return e.message }

func badRequest(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", message: fmt.Sprintf(format, a...)}
}

// validationError mirrors vLLM's handler for request-schema failures
// (type "Bad Request", status 400).
func validationError(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "Bad Request", message: fmt.Sprintf(format, a...)}
}

// wireRequest is the subset of the OpenAI chat/completions request body
// that gpusim reads. Unknown fields are ignored, as vLLM does.
type wireRequest struct {
	Model               string          `json:"model"`
	Messages            *[]chatMessage  `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N         *int64 `json:"n"`
	CacheSalt string `json:"cache_salt"`
}

// parsedRequest is a validated request, before its prompt is shaped.
type parsedRequest struct {
	chat  bool
	model string
	// adapter is the LoRA adapter model names ("" for the base model), and
	// modelJSON the model answers name (set by Instance.modelFor).
	adapter   string
	modelJSON []byte
	// text is the rendered prompt; unit is its bytes per token.
	text []byte
	unit int
	// maxTokens is the number of tokens to generate; limited tells whether
	// the client set it (finish_reason "length") or the default applied
	// (finish_reason "stop").
	maxTokens    int
	limited      bool
	stream       bool
	includeUsage bool
	salt         string
	// resp is what a Responses API request's answer echoes; nil for the
	// other endpoints.
	resp *responsesEcho
}

// parseRequest decodes and validates a request body for ep, rendering the
// prompt into buf (which it may grow and returns in p.text). It checks
// everything vLLM checks before tokenizing except the model name and the
// context length, which need the Config (see Instance.admit).
func parseRequest(body []byte, ep endpoint, bytesPerToken int, buf []byte) (parsedRequest, *apiError) {
	if ep == endpointResponses {
		return parseResponses(body, bytesPerToken, buf)
	}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return parsedRequest{}, validationError("JSON decode error: %v", err)
	}
	hasMessages := w.Messages != nil
	hasPrompt := isPresent(w.Prompt)
	if ep == endpointInvocations {
		switch {
		case hasMessages:
			ep = endpointChat
		case hasPrompt:
			ep = endpointCompletion
		default:
			return parsedRequest{}, badRequest("Cannot find suitable handler for request. Expected one of: " +
				"ChatCompletionRequest (with 'messages'), CompletionRequest (with 'prompt')")
		}
	}
	p := parsedRequest{model: w.Model, stream: w.Stream, salt: w.CacheSalt, text: buf[:0]}
	switch ep {
	case endpointChat:
		if !hasMessages {
			return parsedRequest{}, validationError("messages: Field required")
		}
		msgs := *w.Messages
		for i := range msgs {
			if msgs[i].Role == "" {
				return parsedRequest{}, validationError("messages.%d.role: Field required", i)
			}
		}
		p.chat = true
		p.text = appendChat(p.text, msgs)
		p.unit = bytesPerToken
	default:
		if !hasPrompt {
			return parsedRequest{}, validationError("prompt: Field required")
		}
		var err *apiError
		p.text, p.unit, err = appendPrompt(p.text, w.Prompt, bytesPerToken)
		if err != nil {
			return parsedRequest{}, err
		}
	}
	if len(p.text) == 0 {
		return parsedRequest{}, badRequest("The prompt cannot be empty.")
	}
	limit := w.MaxTokens
	if p.chat && w.MaxCompletionTokens != nil {
		limit = w.MaxCompletionTokens
	}
	if limit != nil {
		if *limit < 1 {
			return parsedRequest{}, &apiError{status: http.StatusBadRequest, typ: "BadRequestError",
				message: fmt.Sprintf("max_tokens must be at least 1, got %d.", *limit), param: "max_tokens"}
		}
		p.limited = true
		p.maxTokens = int(min(*limit, 1<<30))
	}
	if w.N != nil && *w.N != 1 {
		return parsedRequest{}, &apiError{status: http.StatusBadRequest, typ: "BadRequestError",
			message: fmt.Sprintf("gpusim supports n=1 only, got n=%d.", *w.N), param: "n"}
	}
	if w.StreamOptions != nil {
		if !w.Stream {
			return parsedRequest{}, badRequest("Stream options can only be defined when `stream=True`.")
		}
		p.includeUsage = w.StreamOptions.IncludeUsage
	}
	return p, nil
}

// isPresent reports whether a raw JSON field was given and not null.
func isPresent(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// appendPrompt renders a completions prompt: a string, a list of one
// string, a list of token ids, or a list of one list of token ids. Token
// ids become 4 bytes each, so they count exactly one token per id.
func appendPrompt(dst []byte, raw json.RawMessage, bytesPerToken int) ([]byte, int, *apiError) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	switch {
	case len(raw) > 0 && raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return dst, 0, validationError("prompt: %v", err)
		}
		return append(dst, s...), bytesPerToken, nil
	case len(raw) > 0 && raw[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return dst, 0, validationError("prompt: %v", err)
		}
		if len(items) == 0 {
			return dst, 0, badRequest("The prompt cannot be empty.")
		}
		first := bytes.TrimLeft(items[0], " \t\r\n")
		if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			if len(items) != 1 {
				return dst, 0, &apiError{status: http.StatusBadRequest, typ: "BadRequestError",
					message: fmt.Sprintf("gpusim serves one prompt per request, got %d.", len(items)), param: "prompt"}
			}
			return appendPrompt(dst, first, bytesPerToken)
		}
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return dst, 0, validationError("prompt: %v", err)
		}
		return appendTokenIDs(dst, ids), 4, nil
	default:
		return dst, 0, validationError("prompt: Input should be a valid string or a list of token ids")
	}
}

// chatContent is a message's content: a string, null, or a list of parts
// whose text parts are joined with "\n" (as vLLM does); other parts
// (images, audio) are ignored.
type chatContent struct {
	text string
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *chatContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return fmt.Errorf("content: empty value")
	}
	switch b[0] {
	case '"':
		// The decoder has validated b; without escapes it is the text.
		if len(b) >= 2 && bytes.IndexByte(b[1:len(b)-1], '\\') < 0 {
			c.text = string(b[1 : len(b)-1])
			return nil
		}
		return json.Unmarshal(b, &c.text)
	case 'n':
		if string(b) != "null" {
			return fmt.Errorf("content: invalid value")
		}
		c.text = ""
		return nil
	case '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var sb strings.Builder
		n := 0
		for _, p := range parts {
			if p.Type != "text" {
				continue
			}
			if n > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(p.Text)
			n++
		}
		c.text = sb.String()
		return nil
	default:
		return fmt.Errorf("content: input should be a string or a list of content parts")
	}
}
