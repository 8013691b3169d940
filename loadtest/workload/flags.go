package workload

import (
	"flag"
	"fmt"
)

// kindFlag is a flag.Value for Kind.
type kindFlag struct{ k *Kind }

func (f kindFlag) String() string {
	if f.k == nil {
		return ""
	}
	return string(*f.k)
}

func (f kindFlag) Set(s string) error {
	k := Kind(s)
	if !validKind(k) {
		return fmt.Errorf("%w %q (want one of %s)", ErrUnknownKind, s, kindList())
	}
	*f.k = k
	return nil
}

// mixFlag is a flag.Value for the mix weights.
type mixFlag struct{ ws *[]Weight }

func (f mixFlag) String() string {
	if f.ws == nil || len(*f.ws) == 0 {
		return ""
	}
	return FormatMix(*f.ws)
}

func (f mixFlag) Set(s string) error {
	ws, err := ParseMix(s)
	if err != nil {
		return err
	}
	*f.ws = ws
	return nil
}

// BindFlags registers one flag per parameter on fs, writing into c. Call
// it on a Config holding the defaults. The seed flag is left to the caller
// (a load test seeds its arrivals too).
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.Var(kindFlag{&c.Kind}, "workload", "workload: "+kindList())
	fs.StringVar(&c.Model, "model", c.Model, `request "model" (default: the first model of the target's /v1/models)`)
	fs.IntVar(&c.MaxTokens, "max-tokens", c.MaxTokens, "output tokens per request (max_tokens)")
	fs.BoolVar(&c.Stream, "stream", c.Stream, "stream responses (SSE); TTFT is then the first token")
	fs.IntVar(&c.Tenants, "tenants", c.Tenants, "tenants (prompt_cache_key) sending identical prompts; 0 = none")
	fs.Float64Var(&c.Zipf, "zipf", c.Zipf, "popularity skew of documents, templates and files (0 = uniform)")
	fs.Var(mixFlag{&c.Mix}, "mix", "weights of the mix workload, e.g. rag=3,chat=2,noreuse=1")

	fs.IntVar(&c.RAG.Documents, "rag-docs", c.RAG.Documents, "rag: distinct documents")
	fs.IntVar(&c.RAG.DocumentTokens, "rag-doc-tokens", c.RAG.DocumentTokens, "rag: tokens per document")
	fs.IntVar(&c.RAG.QuestionsPerDoc, "rag-questions", c.RAG.QuestionsPerDoc, "rag: distinct questions per document")
	fs.IntVar(&c.RAG.QuestionTokens, "rag-question-tokens", c.RAG.QuestionTokens, "rag: tokens per question")

	fs.IntVar(&c.Chat.Active, "chat-active", c.Chat.Active, "chat: conversations open at once")
	fs.IntVar(&c.Chat.Turns, "chat-turns", c.Chat.Turns, "chat: turns per conversation")
	fs.IntVar(&c.Chat.SystemTokens, "chat-system-tokens", c.Chat.SystemTokens, "chat: system prompt shared by all conversations")
	fs.IntVar(&c.Chat.FirstUserTokens, "chat-first-tokens", c.Chat.FirstUserTokens, "chat: tokens of a conversation's first message")
	fs.IntVar(&c.Chat.UserTokens, "chat-user-tokens", c.Chat.UserTokens, "chat: tokens of later user messages")
	fs.IntVar(&c.Chat.AssistantTokens, "chat-assistant-tokens", c.Chat.AssistantTokens, "chat: tokens of each assistant reply in the history")
	fs.BoolVar(&c.Chat.Stagger, "chat-stagger", c.Chat.Stagger, "chat: start the first conversations part way through, for a steady mix of turns from the start")

	fs.IntVar(&c.Bot.Templates, "bot-templates", c.Bot.Templates, "bot: distinct policy templates")
	fs.IntVar(&c.Bot.PolicyTokens, "bot-policy-tokens", c.Bot.PolicyTokens, "bot: tokens per policy block")
	fs.IntVar(&c.Bot.UserTokens, "bot-user-tokens", c.Bot.UserTokens, "bot: tokens of the user's message")

	fs.IntVar(&c.Code.Files, "code-files", c.Code.Files, "code: distinct files")
	fs.IntVar(&c.Code.FileTokens, "code-file-tokens", c.Code.FileTokens, "code: tokens per file")
	fs.IntVar(&c.Code.EditTokens, "code-edit-tokens", c.Code.EditTokens, "code: tokens typed at the cursor")
	fs.Float64Var(&c.Code.MinCursor, "code-min-cursor", c.Code.MinCursor, "code: earliest cursor as a fraction of the file")

	fs.IntVar(&c.NoReuse.PromptTokens, "noreuse-tokens", c.NoReuse.PromptTokens, "noreuse: tokens per prompt")
}
