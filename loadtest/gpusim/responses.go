package gpusim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
)

// The Responses API (POST /v1/responses), served by the same engine as
// chat: the instructions and the input are rendered as the chat messages
// they stand for (instructions as a system message, a string input as a
// user message, input items in order), so the KV cache sees them as it
// sees chat, and a repeated input hits the cache. Nothing is stored: a
// previous_response_id is never found.

// wireResponses is the subset of a Responses API request that gpusim
// reads. Unknown fields are ignored, as vLLM does.
type wireResponses struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	PreviousResponseID *string         `json:"previous_response_id"`
	CacheSalt          string          `json:"cache_salt"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Metadata           json.RawMessage `json:"metadata"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
}

// responsesEcho is what a Responses answer repeats of its request.
type responsesEcho struct {
	instructions json.RawMessage // a JSON string, or nil for null
	tools        json.RawMessage // a JSON array
	toolChoice   json.RawMessage
	metadata     json.RawMessage // nil for null
	temperature  float64
	topP         float64
}

// parseResponses decodes and validates a Responses API request, rendering
// its prompt into buf as chat messages.
func parseResponses(body []byte, bytesPerToken int, buf []byte) (parsedRequest, *apiError) {
	var w wireResponses
	if err := json.Unmarshal(body, &w); err != nil {
		return parsedRequest{}, validationError("JSON decode error: %v", err)
	}
	if !isPresent(w.Input) {
		return parsedRequest{}, validationError("input: Field required")
	}
	if w.PreviousResponseID != nil && *w.PreviousResponseID != "" {
		id := *w.PreviousResponseID
		if len(id) > 256 {
			id = id[:256]
		}
		return parsedRequest{}, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "previous_response_id",
			message: fmt.Sprintf("Response with id '%s' not found.", id)}
	}
	echo := &responsesEcho{tools: json.RawMessage("[]"), toolChoice: json.RawMessage(`"auto"`), temperature: 1, topP: 1}
	var msgs []chatMessage
	if isPresent(w.Instructions) {
		var s string
		if err := json.Unmarshal(w.Instructions, &s); err != nil {
			return parsedRequest{}, validationError("instructions: Input should be a valid string")
		}
		echo.instructions = w.Instructions
		msgs = append(msgs, chatMessage{Role: "system", Content: chatContent{text: s}})
	}
	msgs, err := appendResponsesInput(msgs, w.Input)
	if err != nil {
		return parsedRequest{}, err
	}
	if isPresent(w.Tools) {
		if bytes.TrimLeft(w.Tools, " \t\r\n")[0] != '[' {
			return parsedRequest{}, validationError("tools: Input should be a valid list")
		}
		echo.tools = w.Tools
	}
	if isPresent(w.ToolChoice) {
		echo.toolChoice = w.ToolChoice
	}
	if isPresent(w.Metadata) {
		echo.metadata = w.Metadata
	}
	if w.Temperature != nil {
		echo.temperature = *w.Temperature
	}
	if w.TopP != nil {
		echo.topP = *w.TopP
	}
	p := parsedRequest{chat: true, model: w.Model, stream: w.Stream, salt: w.CacheSalt, resp: echo}
	p.text = appendChat(buf[:0], msgs)
	p.unit = bytesPerToken
	if w.MaxOutputTokens != nil {
		if *w.MaxOutputTokens < 1 {
			return parsedRequest{}, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "max_output_tokens",
				message: fmt.Sprintf("max_output_tokens must be at least 1, got %d.", *w.MaxOutputTokens)}
		}
		p.limited = true
		p.maxTokens = int(min(*w.MaxOutputTokens, 1<<30))
	}
	return p, nil
}

// appendResponsesInput appends the messages of a Responses input: a string
// is one user message; an array's message items (those with a role) are
// messages whose text parts (input_text, output_text, text) are joined with
// "\n", other parts ignored as chat ignores images; any other item (a
// function call, its output, reasoning) is a message whose role is the
// item's type and whose content is the item's JSON.
func appendResponsesInput(msgs []chatMessage, raw json.RawMessage) ([]chatMessage, *apiError) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, validationError("input: %v", err)
		}
		return append(msgs, chatMessage{Role: "user", Content: chatContent{text: s}}), nil
	case '[':
	default:
		return nil, validationError("input: Input should be a valid string or a list of input items")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, validationError("input: %v", err)
	}
	for i, it := range items {
		var item struct {
			Type    string          `json:"type"`
			Role    *string         `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(it, &item); err != nil || bytes.TrimLeft(it, " \t\r\n")[0] != '{' {
			return nil, validationError("input.%d: Input should be a valid input item", i)
		}
		if item.Role == nil {
			if item.Type == "" {
				return nil, validationError("input.%d.type: Field required", i)
			}
			var compact bytes.Buffer
			_ = json.Compact(&compact, it) // it was decoded above
			msgs = append(msgs, chatMessage{Role: item.Type, Content: chatContent{text: compact.String()}})
			continue
		}
		text, err := responsesContent(item.Content)
		if err != nil {
			return nil, validationError("input.%d.content: %v", i, err)
		}
		msgs = append(msgs, chatMessage{Role: *item.Role, Content: chatContent{text: text}})
	}
	return msgs, nil
}

// responsesContent is a message item's text: a string, null, or a list of
// parts whose text parts are joined with "\n".
func responsesContent(raw json.RawMessage) (string, error) {
	if !isPresent(raw) {
		return "", nil
	}
	var s string
	if raw = bytes.TrimLeft(raw, " \t\r\n"); raw[0] == '"' {
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("input should be a string or a list of content parts")
	}
	var sb strings.Builder
	n := 0
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			if n > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(p.Text)
			n++
		}
	}
	return sb.String(), nil
}

// Wire shapes of the answer (vLLM's ResponsesResponse).
type (
	responsesObject struct {
		ID                 string             `json:"id"`
		Object             string             `json:"object"`
		CreatedAt          int64              `json:"created_at"`
		Status             string             `json:"status"`
		Background         bool               `json:"background"`
		Error              json.RawMessage    `json:"error"`
		IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
		Instructions       json.RawMessage    `json:"instructions"`
		MaxOutputTokens    int                `json:"max_output_tokens"`
		MaxToolCalls       *int               `json:"max_tool_calls"`
		Metadata           json.RawMessage    `json:"metadata"`
		Model              json.RawMessage    `json:"model"`
		Output             []responsesMessage `json:"output"`
		ParallelToolCalls  bool               `json:"parallel_tool_calls"`
		PreviousResponseID *string            `json:"previous_response_id"`
		Reasoning          json.RawMessage    `json:"reasoning"`
		ServiceTier        string             `json:"service_tier"`
		Temperature        float64            `json:"temperature"`
		ToolChoice         json.RawMessage    `json:"tool_choice"`
		Tools              json.RawMessage    `json:"tools"`
		TopLogprobs        int                `json:"top_logprobs"`
		TopP               float64            `json:"top_p"`
		Truncation         string             `json:"truncation"`
		Usage              *responsesUsage    `json:"usage"`
		User               *string            `json:"user"`
	}
	incompleteDetails struct {
		Reason string `json:"reason"`
	}
	responsesMessage struct {
		ID      string          `json:"id"`
		Type    string          `json:"type"`
		Status  string          `json:"status"`
		Role    string          `json:"role"`
		Content []responsesText `json:"content"`
	}
	responsesText struct {
		Type        string     `json:"type"`
		Text        string     `json:"text"`
		Annotations []struct{} `json:"annotations"`
		Logprobs    []struct{} `json:"logprobs"`
	}
	responsesUsage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int `json:"total_tokens"`
	}
)

// responsesState builds a Responses answer's objects.
type responsesState struct {
	rs    *response
	msgID string
	seq   int // next sequence_number
}

func newResponsesState(rs *response) *responsesState {
	rs.id = randomID("resp_")
	return &responsesState{rs: rs, msgID: randomID("msg_")}
}

// object is the response object: status "in_progress" without output and
// usage, or final with the whole text.
func (st *responsesState) object(final bool) *responsesObject {
	rs := st.rs
	e := rs.p.resp
	o := &responsesObject{
		ID: rs.id, Object: "response", CreatedAt: rs.created, Status: "in_progress",
		Instructions: e.instructions, MaxOutputTokens: rs.s.maxTokens, Metadata: e.metadata,
		Model: rs.p.modelJSON, Output: []responsesMessage{}, ParallelToolCalls: true, ServiceTier: "auto",
		Temperature: e.temperature, ToolChoice: e.toolChoice, Tools: e.tools, TopP: e.topP, Truncation: "disabled",
	}
	if !final {
		return o
	}
	o.Status = "completed"
	if rs.s.limited {
		o.Status, o.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	}
	o.Output = []responsesMessage{st.message(st.text(), "completed")}
	u := &responsesUsage{InputTokens: rs.s.shape.tokens, OutputTokens: rs.s.maxTokens, TotalTokens: rs.s.shape.tokens + rs.s.maxTokens}
	u.InputTokensDetails.CachedTokens = rs.s.cachedTokens
	o.Usage = u
	return o
}

func (st *responsesState) message(text, status string) responsesMessage {
	m := responsesMessage{ID: st.msgID, Type: "message", Status: status, Role: "assistant", Content: []responsesText{}}
	if status == "completed" {
		m.Content = append(m.Content, outputText(text))
	}
	return m
}

func outputText(text string) responsesText {
	return responsesText{Type: "output_text", Text: text, Annotations: []struct{}{}, Logprobs: []struct{}{}}
}

// text is the whole generated text.
func (st *responsesState) text() string {
	rs := st.rs
	var sb strings.Builder
	for i := 0; i < rs.s.maxTokens; i++ {
		sb.WriteString(rs.in.fill.token(rs.s.shape.seed, i))
	}
	return sb.String()
}

// fullResponses waits for the whole generation and writes the response
// object.
func (rs *response) fullResponses(ctx context.Context, w http.ResponseWriter) {
	st := newResponsesState(rs)
	for i := 0; i < rs.s.maxTokens; i++ {
		rs.waitToken(ctx)
	}
	writeJSON(w, http.StatusOK, st.object(true))
}

// appendEvent appends one Server-Sent Event, "event: <typ>" and its data:
// v (which must marshal to a non-empty JSON object) with "type" and
// "sequence_number" first.
func (st *responsesState) appendEvent(dst []byte, typ string, v any) []byte {
	b, _ := json.Marshal(v) // fixed shapes
	dst = st.appendHead(dst, typ)
	dst = append(dst, ',')
	dst = append(dst, b[1:]...)
	return append(dst, "\n\n"...)
}

// appendHead appends `event: <typ>\ndata: {"type":"<typ>","sequence_number":N`.
func (st *responsesState) appendHead(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	dst = append(dst, `","sequence_number":`...)
	dst = strconv.AppendInt(dst, int64(st.seq), 10)
	st.seq++
	return dst
}

type (
	responseEvent struct {
		Response *responsesObject `json:"response"`
	}
	itemEvent struct {
		OutputIndex int              `json:"output_index"`
		Item        responsesMessage `json:"item"`
	}
	partEvent struct {
		ItemID       string        `json:"item_id"`
		OutputIndex  int           `json:"output_index"`
		ContentIndex int           `json:"content_index"`
		Part         responsesText `json:"part"`
	}
	textDoneEvent struct {
		ItemID       string     `json:"item_id"`
		OutputIndex  int        `json:"output_index"`
		ContentIndex int        `json:"content_index"`
		Text         string     `json:"text"`
		Logprobs     []struct{} `json:"logprobs"`
	}
)

// streamResponses writes the Responses API's events: response.created,
// response.in_progress, response.output_item.added,
// response.content_part.added, then response.output_text.delta events as
// tokens come (merged as chat chunks are), response.output_text.done,
// response.content_part.done, response.output_item.done and
// response.completed (response.incomplete when max_output_tokens cut the
// answer short).
func (rs *response) streamResponses(ctx context.Context, w http.ResponseWriter) {
	st := newResponsesState(rs)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 0, 2048)
	buf = st.appendEvent(buf, "response.created", responseEvent{st.object(false)})
	buf = st.appendEvent(buf, "response.in_progress", responseEvent{st.object(false)})
	buf = st.appendEvent(buf, "response.output_item.added", itemEvent{Item: st.message("", "in_progress")})
	buf = st.appendEvent(buf, "response.content_part.added", partEvent{ItemID: st.msgID, Part: outputText("")})
	if _, err := w.Write(buf); err != nil || rc.Flush() != nil {
		rs.in.eng.abort(rs.s)
		return
	}
	total, interval := rs.s.maxTokens, rs.in.cfg.StreamInterval
	got, sent := 0, 0
	for got < total {
		var due bool
		if got, due = rs.gather(ctx, got, sent, interval); !due {
			continue
		}
		buf = st.appendHead(buf[:0], "response.output_text.delta")
		buf = append(buf, `,"item_id":"`...)
		buf = append(buf, st.msgID...)
		buf = append(buf, `","output_index":0,"content_index":0,"delta":"`...)
		for ; sent < got; sent++ {
			buf = append(buf, rs.in.fill.token(rs.s.shape.seed, sent)...)
		}
		buf = append(buf, `","logprobs":[]}`+"\n\n"...)
		if got == total {
			text := st.text()
			buf = st.appendEvent(buf, "response.output_text.done", textDoneEvent{ItemID: st.msgID, Text: text, Logprobs: []struct{}{}})
			buf = st.appendEvent(buf, "response.content_part.done", partEvent{ItemID: st.msgID, Part: outputText(text)})
			buf = st.appendEvent(buf, "response.output_item.done", itemEvent{Item: st.message(text, "completed")})
			final := st.object(true)
			terminal := "response.completed"
			if final.Status == "incomplete" {
				terminal = "response.incomplete"
			}
			buf = st.appendEvent(buf, terminal, responseEvent{final})
		}
		if _, err := w.Write(buf); err != nil || rc.Flush() != nil {
			if got < total {
				rs.in.eng.abort(rs.s)
			}
			return
		}
	}
}

// randomID returns prefix and 32 random hex digits.
func randomID(prefix string) string {
	const hex = "0123456789abcdef"
	b := make([]byte, len(prefix), len(prefix)+32)
	copy(b, prefix)
	for _, v := range [2]uint64{rand.Uint64(), rand.Uint64()} {
		for i := 0; i < 16; i++ {
			b = append(b, hex[v>>60])
			v <<= 4
		}
	}
	return string(b)
}
