package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// workload is the request mix every target gets: OpenAI chat bodies of
// exactly BodySize bytes, Prefixes distinct system prompts (the shared
// prefixes) times Suffixes user questions each.
type workload struct {
	BodySize, Prefixes, Suffixes int
	Stream                       bool
	// MaxTokens is each request's max_tokens (16 when 0); Usage asks for
	// the usage chunk at a stream's end (stream_options.include_usage), as
	// OpenAI clients that count tokens do.
	MaxTokens int
	Usage     bool
}

var words = strings.Fields(`the of and to in is for on that with as by this be are from at or an it
not which have has was can will all more their one about other been into than may most its some
such only over also after before these many where when who what use used using data model request
cache prefix token router instance backend document policy answer question context retrieval`)

// benchModel is the model every request names (gpusim serves it).
const benchModel = "meta-llama/Llama-3.1-8B-Instruct"

func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatRequest struct {
	Model         string         `json:"model"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Messages      []chatMessage  `json:"messages"`
}

// bodies returns Prefixes x Suffixes request bodies, deterministic, in an
// order that cycles through the prefixes. The system prompt takes about
// three quarters of each body.
func (w workload) bodies() ([][]byte, error) {
	rng := rand.New(rand.NewPCG(42, 7))
	system := make([]string, w.Prefixes)
	for i := range system {
		system[i] = fmt.Sprintf("You are assistant %d. ", i) + text(rng, w.BodySize*3/4)
	}
	maxTokens := w.MaxTokens
	if maxTokens == 0 {
		maxTokens = 16
	}
	var opts *streamOptions
	if w.Usage {
		opts = &streamOptions{IncludeUsage: true}
	}
	var out [][]byte
	for s := 0; s < w.Suffixes; s++ {
		for p := 0; p < w.Prefixes; p++ {
			req := chatRequest{Model: benchModel, Stream: w.Stream, StreamOptions: opts, MaxTokens: maxTokens,
				Messages: []chatMessage{{Role: "system", Content: system[p]}, {Role: "user", Content: ""}}}
			b, err := json.Marshal(req)
			if err != nil {
				return nil, err
			}
			pad := w.BodySize - len(b)
			if pad < 16 {
				return nil, fmt.Errorf("body size %d too small", w.BodySize)
			}
			req.Messages[1].Content = fmt.Sprintf("Question %d: ", s) + text(rng, pad)
			req.Messages[1].Content = req.Messages[1].Content[:pad]
			if b, err = json.Marshal(req); err != nil {
				return nil, err
			}
			if len(b) != w.BodySize {
				return nil, fmt.Errorf("body is %d bytes, want %d", len(b), w.BodySize)
			}
			out = append(out, b)
		}
	}
	return out, nil
}
