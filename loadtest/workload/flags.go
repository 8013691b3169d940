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

	fs.IntVar(&c.SysPrompt.Prompts, "sysprompt-prompts", c.SysPrompt.Prompts, "sysprompt: distinct system prompts")
	fs.IntVar(&c.SysPrompt.MinChars, "sysprompt-min-chars", c.SysPrompt.MinChars, "sysprompt: characters of the shortest system prompt")
	fs.IntVar(&c.SysPrompt.MaxChars, "sysprompt-max-chars", c.SysPrompt.MaxChars, "sysprompt: characters of the longest system prompt")
	fs.IntVar(&c.SysPrompt.QuestionTokens, "sysprompt-question-tokens", c.SysPrompt.QuestionTokens, "sysprompt: tokens of the user's question, unique to the request")
	fs.Float64Var(&c.SysPrompt.Zipf, "sysprompt-zipf", c.SysPrompt.Zipf, "sysprompt: popularity skew of the system prompts (0 = uniform; --zipf does not apply)")

	fs.IntVar(&c.Preamble.Chars, "preamble-chars", c.Preamble.Chars, "preamble: characters of the preamble every request opens with")
	fs.IntVar(&c.Preamble.Active, "preamble-active", c.Preamble.Active, "preamble: conversations open at once")
	fs.IntVar(&c.Preamble.Turns, "preamble-turns", c.Preamble.Turns, "preamble: turns per conversation")
	fs.IntVar(&c.Preamble.FirstUserTokens, "preamble-first-tokens", c.Preamble.FirstUserTokens, "preamble: tokens of a conversation's first message, right after the preamble")
	fs.IntVar(&c.Preamble.UserTokens, "preamble-user-tokens", c.Preamble.UserTokens, "preamble: tokens of later user messages")
	fs.IntVar(&c.Preamble.AssistantTokens, "preamble-assistant-tokens", c.Preamble.AssistantTokens, "preamble: tokens of each assistant reply in the history")
	fs.BoolVar(&c.Preamble.Stagger, "preamble-stagger", c.Preamble.Stagger, "preamble: start the first conversations part way through, for a steady mix of turns from the start")

	fs.IntVar(&c.Agent.Active, "agent-active", c.Agent.Active, "agent: sessions open at once")
	fs.IntVar(&c.Agent.Turns, "agent-turns", c.Agent.Turns, "agent: turns per session (the task, then one tool call and result a turn)")
	fs.IntVar(&c.Agent.SystemTokens, "agent-system-tokens", c.Agent.SystemTokens, "agent: tool-use system prompt shared by all sessions")
	fs.IntVar(&c.Agent.TaskTokens, "agent-task-tokens", c.Agent.TaskTokens, "agent: tokens of a session's task message")
	fs.IntVar(&c.Agent.CallTokens, "agent-call-tokens", c.Agent.CallTokens, "agent: tokens of each assistant tool call")
	fs.IntVar(&c.Agent.MinResultTokens, "agent-min-result-tokens", c.Agent.MinResultTokens, "agent: tokens of the smallest tool result")
	fs.IntVar(&c.Agent.MaxResultTokens, "agent-max-result-tokens", c.Agent.MaxResultTokens, "agent: tokens of the largest tool result")
	fs.BoolVar(&c.Agent.Stagger, "agent-stagger", c.Agent.Stagger, "agent: start the first sessions part way through, for a steady mix of turns from the start")
}
