package workload

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Kind names a workload.
type Kind string

// The workloads.
const (
	KindRAG       Kind = "rag"       // documents of a given size, several questions each
	KindChat      Kind = "chat"      // multi-turn conversations resending their history
	KindBot       Kind = "bot"       // templated bots: a long policy block shared by all users
	KindCode      Kind = "code"      // code completion: a file's text up to a cursor
	KindNoReuse   Kind = "noreuse"   // unrelated prompts: the control
	KindSysPrompt Kind = "sysprompt" // Zipf-popular system prompts, each request a question of its own
	KindPreamble  Kind = "preamble"  // one long preamble shared by all, multi-turn conversations on top
	KindAgent     Kind = "agent"     // agentic sessions whose histories grow by tool calls and results
	KindMix       Kind = "mix"       // a weighted mix of the above
)

// Kinds lists the workloads in a fixed order.
func Kinds() []Kind {
	return []Kind{KindRAG, KindChat, KindBot, KindCode, KindNoReuse, KindSysPrompt, KindPreamble, KindAgent, KindMix}
}

// API paths the generated requests use.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
)

// Errors returned by Validate and ParseMix.
var (
	ErrUnknownKind = errors.New("workload: unknown kind")
	ErrBadConfig   = errors.New("workload: invalid config")
)

// RAGConfig shapes the retrieval-augmented workload: a request is a fixed
// system prompt, one document and one of that document's questions.
type RAGConfig struct {
	Documents       int // distinct documents
	DocumentTokens  int // tokens per document
	QuestionsPerDoc int // distinct questions per document
	QuestionTokens  int // tokens per question
}

// ChatConfig shapes the multi-turn chat workload. Conversations are
// interleaved: each request advances one of Active open conversations by a
// turn and resends its whole history; a conversation that reaches Turns
// turns is replaced by a new one.
type ChatConfig struct {
	Active          int // open conversations at any time
	Turns           int // turns per conversation
	SystemTokens    int // system prompt, shared by every conversation
	FirstUserTokens int // first user message (makes conversations distinct early)
	UserTokens      int // later user messages
	AssistantTokens int // assistant replies written into the history
	// Stagger starts the first conversation of each slot part way through
	// its turns (slot i at turn i x Turns / Active, with a history it
	// never sent), so that a short run sees the long-run mix of turns
	// instead of every conversation starting together.
	Stagger bool
}

// BotConfig shapes the templated-bot workload: every user of a template
// sends the same long policy block followed by a short message of their own.
type BotConfig struct {
	Templates    int // distinct bots
	PolicyTokens int // tokens of each policy block (tens of KB of text)
	UserTokens   int // tokens of the user's message
}

// CodeConfig shapes the code-completion workload (/v1/completions): the
// prompt is a file's text up to a cursor plus the edit typed there, so
// requests on the same file share the file's first part.
type CodeConfig struct {
	Files      int // distinct files
	FileTokens int // tokens per file
	EditTokens int // tokens typed at the cursor
	// MinCursor is the earliest cursor position as a fraction of the file
	// (0-1): every request on a file shares at least this fraction of it.
	MinCursor float64
}

// NoReuseConfig shapes the control workload: prompts share nothing, not
// even their first characters.
type NoReuseConfig struct {
	PromptTokens int
}

// SysPromptConfig shapes the popular-system-prompt workload: a request is
// one of Prompts system prompts, drawn by Zipf popularity, and a user
// question of its own. Each prompt's length is drawn once, from the seed,
// between MinChars and MaxChars characters; distinct prompts differ from
// their first characters on.
type SysPromptConfig struct {
	Prompts        int // distinct system prompts
	MinChars       int // shortest system prompt, in characters
	MaxChars       int // longest system prompt, in characters
	QuestionTokens int // tokens of the user's question, unique to the request
	// Zipf is the popularity skew over the prompts: prompt i (0-based) is
	// drawn with probability proportional to 1/(i+1)^Zipf. It is this
	// workload's own; Config.Zipf does not apply.
	Zipf float64
}

// PreambleConfig shapes the shared-preamble workload: every request opens
// with the same preamble of Chars characters (the system message), and
// Active multi-turn conversations, as in the chat workload, continue after
// it. A conversation's identity is its first user message, right after the
// preamble, so a routing key shorter than the preamble sees one prefix.
type PreambleConfig struct {
	Chars           int // the preamble, in characters; the same for every request
	Active          int // open conversations at any time
	Turns           int // turns per conversation
	FirstUserTokens int // first user message, right after the preamble
	UserTokens      int // later user messages
	AssistantTokens int // assistant replies written into the history
	// Stagger starts the first conversations part way through, as
	// ChatConfig.Stagger does.
	Stagger bool
}

// AgentConfig shapes the agentic workload. A session is a tool-use system
// prompt shared by every session and a task message of its own; each later
// turn appends an assistant tool call and the tool's result (of a size drawn
// between MinResultTokens and MaxResultTokens) and resends the whole
// history. Active sessions are interleaved as chat conversations are; one
// that has had Turns turns is replaced by a new one.
type AgentConfig struct {
	Active          int // open sessions at any time
	Turns           int // turns per session: the task, then Turns-1 tool calls with their results
	SystemTokens    int // tool-use system prompt, shared by every session
	TaskTokens      int // the session's task message
	CallTokens      int // each assistant tool call
	MinResultTokens int // smallest tool result
	MaxResultTokens int // largest tool result
	// Stagger starts the first sessions part way through, as
	// ChatConfig.Stagger does.
	Stagger bool
}

// Weight is one component of a mix.
type Weight struct {
	Kind   Kind
	Weight float64
}

// Config describes a workload completely; with the same Config a Generator
// produces the same requests.
type Config struct {
	Kind Kind
	Seed uint64
	// Model is the request's "model"; "" leaves the field out (the
	// endpoint's default model; load tests fill it from /v1/models).
	Model string
	// MaxTokens is max_tokens of every request (the output length).
	MaxTokens int
	// Stream asks for SSE streaming with usage in the last chunk.
	Stream bool
	// Tenants > 0 adds prompt_cache_key "tenant-NN", drawn uniformly, to
	// every request: tenants send identical prompts and must not share a
	// routing key.
	Tenants int
	// Zipf is the popularity skew over documents, templates and files:
	// item i (0-based) is drawn with probability proportional to
	// 1/(i+1)^Zipf. 0 is uniform.
	Zipf float64

	RAG     RAGConfig
	Chat    ChatConfig
	Bot     BotConfig
	Code    CodeConfig
	NoReuse NoReuseConfig
	// SysPrompt, Preamble and Agent are the sections of the workloads of
	// the same names.
	SysPrompt SysPromptConfig
	Preamble  PreambleConfig
	Agent     AgentConfig
	// Mix is used when Kind is KindMix.
	Mix []Weight
}

// DefaultConfig returns a RAG workload with moderate sizes; every kind's
// section is filled so changing Kind alone gives a sensible workload.
func DefaultConfig() Config {
	return Config{
		Kind:      KindRAG,
		Seed:      1,
		MaxTokens: 32,
		Stream:    true,
		RAG: RAGConfig{
			Documents:       32,
			DocumentTokens:  2000,
			QuestionsPerDoc: 8,
			QuestionTokens:  24,
		},
		Chat: ChatConfig{
			Active:          32,
			Turns:           8,
			SystemTokens:    40,
			FirstUserTokens: 400,
			UserTokens:      60,
			AssistantTokens: 120,
			Stagger:         true,
		},
		Bot: BotConfig{
			Templates:    4,
			PolicyTokens: 8000,
			UserTokens:   60,
		},
		Code: CodeConfig{
			Files:      24,
			FileTokens: 3000,
			EditTokens: 12,
			MinCursor:  0.5,
		},
		NoReuse: NoReuseConfig{PromptTokens: 2000},
		SysPrompt: SysPromptConfig{
			Prompts:        64,
			MinChars:       2000,
			MaxChars:       6000,
			QuestionTokens: 40,
			Zipf:           1.1,
		},
		Preamble: PreambleConfig{
			Chars:           12288,
			Active:          200,
			Turns:           8,
			FirstUserTokens: 400,
			UserTokens:      60,
			AssistantTokens: 120,
			Stagger:         true,
		},
		Agent: AgentConfig{
			Active:          64,
			Turns:           12,
			SystemTokens:    1500,
			TaskTokens:      200,
			CallTokens:      50,
			MinResultTokens: 100,
			MaxResultTokens: 1500,
			Stagger:         true,
		},
		Mix: []Weight{
			{KindRAG, 0.3}, {KindChat, 0.3}, {KindBot, 0.15},
			{KindCode, 0.15}, {KindNoReuse, 0.1},
		},
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	if !validKind(c.Kind) {
		return fmt.Errorf("%w %q (want one of %s)", ErrUnknownKind, c.Kind, kindList())
	}
	if c.MaxTokens < 1 {
		return bad("max tokens %d < 1", c.MaxTokens)
	}
	if c.Tenants < 0 || c.Tenants > 9999 {
		return bad("tenants %d outside 0-9999", c.Tenants)
	}
	if c.Zipf < 0 || c.Zipf > 10 {
		return bad("zipf %g outside 0-10", c.Zipf)
	}
	kinds := []Kind{c.Kind}
	if c.Kind == KindMix {
		if len(c.Mix) == 0 {
			return bad("mix is empty")
		}
		kinds = kinds[:0]
		total := 0.0
		for _, w := range c.Mix {
			if w.Kind == KindMix || !validKind(w.Kind) {
				return fmt.Errorf("%w %q in mix", ErrUnknownKind, w.Kind)
			}
			if w.Weight < 0 {
				return bad("mix weight of %s is negative", w.Kind)
			}
			total += w.Weight
			kinds = append(kinds, w.Kind)
		}
		if total <= 0 {
			return bad("mix weights sum to 0")
		}
	}
	for _, k := range kinds {
		if err := c.validateKind(k); err != nil {
			return err
		}
	}
	return nil
}

const maxTokens = 1 << 20 // a sanity bound on any single size

func (c Config) validateKind(k Kind) error {
	type field struct {
		name     string
		v, lo, h int
	}
	var fs []field
	var cross error // a check beyond the ranges, reported after them
	switch k {
	case KindRAG:
		r := c.RAG
		fs = []field{
			{"rag documents", r.Documents, 1, 1 << 20},
			{"rag document tokens", r.DocumentTokens, 1, maxTokens},
			{"rag questions per document", r.QuestionsPerDoc, 1, 1 << 16},
			{"rag question tokens", r.QuestionTokens, 1, maxTokens},
		}
	case KindChat:
		h := c.Chat
		fs = []field{
			{"chat active conversations", h.Active, 1, 1 << 20},
			{"chat turns", h.Turns, 1, 1024},
			{"chat system tokens", h.SystemTokens, 0, maxTokens},
			{"chat first user tokens", h.FirstUserTokens, 1, maxTokens},
			{"chat user tokens", h.UserTokens, 1, maxTokens},
			{"chat assistant tokens", h.AssistantTokens, 1, maxTokens},
		}
	case KindBot:
		b := c.Bot
		fs = []field{
			{"bot templates", b.Templates, 1, 1 << 16},
			{"bot policy tokens", b.PolicyTokens, 1, maxTokens},
			{"bot user tokens", b.UserTokens, 1, maxTokens},
		}
	case KindCode:
		d := c.Code
		fs = []field{
			{"code files", d.Files, 1, 1 << 20},
			{"code file tokens", d.FileTokens, 8, maxTokens},
			{"code edit tokens", d.EditTokens, 1, maxTokens},
		}
		if d.MinCursor < 0 || d.MinCursor > 1 {
			return fmt.Errorf("%w: code min cursor %g outside 0-1", ErrBadConfig, d.MinCursor)
		}
	case KindNoReuse:
		fs = []field{{"noreuse prompt tokens", c.NoReuse.PromptTokens, 1, maxTokens}}
	case KindSysPrompt:
		p := c.SysPrompt
		fs = []field{
			{"sysprompt prompts", p.Prompts, 1, 1 << 20},
			{"sysprompt min chars", p.MinChars, minSysPromptChars, 4 * maxTokens},
			{"sysprompt max chars", p.MaxChars, minSysPromptChars, 4 * maxTokens},
			{"sysprompt question tokens", p.QuestionTokens, 1, maxTokens},
		}
		switch {
		case p.Zipf < 0 || p.Zipf > 10:
			cross = fmt.Errorf("%w: sysprompt zipf %g outside 0-10", ErrBadConfig, p.Zipf)
		case p.MinChars > p.MaxChars:
			cross = fmt.Errorf("%w: sysprompt min chars %d > max chars %d", ErrBadConfig, p.MinChars, p.MaxChars)
		}
	case KindPreamble:
		p := c.Preamble
		fs = []field{
			{"preamble chars", p.Chars, 1, 4 * maxTokens},
			{"preamble active conversations", p.Active, 1, 1 << 20},
			{"preamble turns", p.Turns, 1, 1024},
			{"preamble first user tokens", p.FirstUserTokens, 1, maxTokens},
			{"preamble user tokens", p.UserTokens, 1, maxTokens},
			{"preamble assistant tokens", p.AssistantTokens, 1, maxTokens},
		}
	case KindAgent:
		a := c.Agent
		fs = []field{
			{"agent active sessions", a.Active, 1, 1 << 20},
			{"agent turns", a.Turns, 1, 1024},
			{"agent system tokens", a.SystemTokens, 0, maxTokens},
			{"agent task tokens", a.TaskTokens, 1, maxTokens},
			{"agent call tokens", a.CallTokens, 1, maxTokens},
			{"agent min result tokens", a.MinResultTokens, 1, maxTokens},
			{"agent max result tokens", a.MaxResultTokens, 1, maxTokens},
		}
		if a.MinResultTokens > a.MaxResultTokens {
			cross = fmt.Errorf("%w: agent min result tokens %d > max result tokens %d", ErrBadConfig, a.MinResultTokens, a.MaxResultTokens)
		}
	}
	for _, f := range fs {
		if f.v < f.lo || f.v > f.h {
			return fmt.Errorf("%w: %s %d outside %d-%d", ErrBadConfig, f.name, f.v, f.lo, f.h)
		}
	}
	return cross
}

func validKind(k Kind) bool {
	for _, x := range Kinds() {
		if k == x {
			return true
		}
	}
	return false
}

func kindList() string {
	ks := Kinds()
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// ParseMix parses "rag=3,chat=2,noreuse=1" into weights.
func ParseMix(s string) ([]Weight, error) {
	var ws []Weight
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%w: mix entry %q is not kind=weight", ErrBadConfig, part)
		}
		k := Kind(strings.TrimSpace(name))
		if k == KindMix || !validKind(k) {
			return nil, fmt.Errorf("%w %q in mix", ErrUnknownKind, name)
		}
		w, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || w < 0 {
			return nil, fmt.Errorf("%w: mix weight %q", ErrBadConfig, val)
		}
		ws = append(ws, Weight{k, w})
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("%w: mix is empty", ErrBadConfig)
	}
	return ws, nil
}

// FormatMix is the inverse of ParseMix, with kinds sorted.
func FormatMix(ws []Weight) string {
	c := append([]Weight(nil), ws...)
	sort.Slice(c, func(i, j int) bool { return c[i].Kind < c[j].Kind })
	parts := make([]string, len(c))
	for i, w := range c {
		parts[i] = string(w.Kind) + "=" + strconv.FormatFloat(w.Weight, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}
