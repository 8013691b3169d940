package gpusim

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func openaiClient(ts *testServer) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(ts.srv.URL+"/v1/"),
		option.WithAPIKey("unused"),
		option.WithHTTPClient(ts.c),
		option.WithMaxRetries(0),
	)
}

func TestOfficialOpenAIClient(t *testing.T) {
	ts := startInstance(t, FastConfig())
	client := openaiClient(ts)
	ctx := t.Context()
	model := "meta-llama/Llama-3.1-70B-Instruct"
	system := words("You are a support bot. Policy:", 3000)
	params := openai.ChatCompletionNewParams{
		Model: model,
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(system),
			openai.UserMessage("How do I reset my password?"),
		},
		MaxCompletionTokens: openai.Int(12),
	}

	// Non-streaming.
	res, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(res.Choices) != 1 || res.Choices[0].Message.Content == "" || res.Choices[0].FinishReason != "length" ||
		res.Model != model || res.Object != "chat.completion" || !strings.HasPrefix(res.ID, "chatcmpl-") {
		t.Fatalf("chat response: %+v", res)
	}
	if n := len(strings.Fields(res.Choices[0].Message.Content)); n != 12 {
		t.Fatalf("content %q: %d words, want 12", res.Choices[0].Message.Content, n)
	}
	u := res.Usage
	wantPrompt := int64((len("<|system|>\n"+system+"<|eot|>\n<|user|>\nHow do I reset my password?<|eot|>\n<|assistant|>\n") + 3) / 4)
	if u.PromptTokens != wantPrompt || u.CompletionTokens != 12 || u.TotalTokens != wantPrompt+12 || u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %+v, want %d prompt tokens, none cached", u, wantPrompt)
	}

	// Streaming, with usage, same prompt: now cached.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if got, want := acc.Choices[0].Message.Content, res.Choices[0].Message.Content; got != want {
		t.Fatalf("streamed content %q, want the same as unstreamed %q", got, want)
	}
	// Role chunk, 1 to 12 token chunks (tokens that pile up are merged),
	// usage chunk.
	if acc.Choices[0].FinishReason != "length" || chunks < 3 || chunks > 1+12+1 {
		t.Fatalf("finish %q after %d chunks, want length after role + tokens + usage", acc.Choices[0].FinishReason, chunks)
	}
	su := acc.Usage
	if su.PromptTokens != wantPrompt || su.CompletionTokens != 12 || su.PromptTokensDetails.CachedTokens != (wantPrompt-1)/16*16 {
		t.Fatalf("stream usage %+v, want cached %d", su, (wantPrompt-1)/16*16)
	}

	// Completions, both ways.
	cp := openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(model),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(words("def main():", 500))},
		MaxTokens: openai.Int(5),
	}
	cres, err := client.Completions.New(ctx, cp)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if cres.Choices[0].Text == "" || cres.Choices[0].FinishReason != "length" || cres.Usage.CompletionTokens != 5 || cres.Usage.PromptTokens != 125 {
		t.Fatalf("completion %+v", cres)
	}
	cp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	cs := client.Completions.NewStreaming(ctx, cp)
	var text strings.Builder
	var cached int64 = -1
	for cs.Next() {
		c := cs.Current()
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
		}
		if c.Usage.TotalTokens > 0 {
			cached = c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatalf("completion stream: %v", err)
	}
	if text.String() != cres.Choices[0].Text || cached != 112 {
		t.Fatalf("streamed completion %q cached %d; want %q and 112", text.String(), cached, cres.Choices[0].Text)
	}

	// Errors decode as OpenAI errors.
	params.Model = "no-such-model"
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	_, err = client.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || !strings.Contains(apiErr.Message, "does not exist") {
		t.Fatalf("unknown model: %v", err)
	}
	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != model {
		t.Fatalf("models: %+v %v", models, err)
	}
}
