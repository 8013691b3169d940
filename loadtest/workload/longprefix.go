package workload

import (
	"math/rand/v2"
	"strconv"
)

// The workloads in this file share prefixes of shapes the other sources do
// not have: many system prompts of mixed lengths and skewed popularity,
// one preamble longer than a routing key in front of everything, and
// agentic sessions whose histories grow by thousands of tokens a turn.

// minSysPromptChars is the shortest system prompt allowed: long enough for
// the opening that makes every prompt distinct (a 64-bit number in base 36
// and the prompt's index, at most 23 characters).
const minSysPromptChars = 32

// sysPrompt: one of Prompts system prompts, drawn by Zipf popularity, then
// a user question of the request's own.
type sysPrompt struct {
	cfg     *Config
	rng     *rand.Rand
	pop     *zipf
	prompts []string // lazily generated
	groups  []string
	msgs    []message
	user    []byte
}

func newSysPrompt(c *Config, r *rand.Rand) *sysPrompt {
	n := c.SysPrompt.Prompts
	return &sysPrompt{cfg: c, rng: r, pop: newZipf(n, c.SysPrompt.Zipf),
		prompts: make([]string, n), groups: make([]string, n), msgs: make([]message, 2)}
}

// sysPromptRand returns the generator of prompt i's text and the prompt's
// length in characters, the generator's first draw.
func sysPromptRand(c *Config, i int) (*rand.Rand, int) {
	r := subRand(c.Seed, "sysprompt-prompt", i)
	p := c.SysPrompt
	return r, p.MinChars + r.IntN(p.MaxChars-p.MinChars+1)
}

func (s *sysPrompt) prompt(i int) string {
	if s.prompts[i] == "" {
		r, n := sysPromptRand(s.cfg, i)
		// a random number, then the index: prompts differ from their
		// first characters, and always within the first 23
		b := make([]byte, 0, n)
		b = strconv.AppendUint(b, r.Uint64(), 36)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, ". "...)
		b = appendChars(b, r, n-len(b))
		s.prompts[i] = string(b)
		s.groups[i] = "sysprompt/prompt-" + strconv.Itoa(i)
	}
	return s.prompts[i]
}

func (s *sysPrompt) next(r *Request) {
	i := s.pop.draw(s.rng)
	s.user = appendWords(s.user[:0], s.rng, s.cfg.SysPrompt.QuestionTokens)
	s.msgs[0] = message{"system", []string{s.prompt(i)}}
	s.msgs[1] = message{"user", []string{string(s.user)}}
	r.setChat(s.cfg, s.groups[i], s.msgs)
}

// newPreamble returns the preamble workload: the chat engine with the
// preamble, exactly Chars characters, as every conversation's system
// prompt.
func newPreamble(c *Config, r *rand.Rand) *chat {
	p := &c.Preamble
	text := []byte("Shared instructions and reference material.\n")
	if len(text) >= p.Chars {
		text = text[:p.Chars]
	} else {
		text = appendChars(text, subRand(c.Seed, "preamble", 0), p.Chars-len(text))
	}
	return &chat{cfg: c, rng: r, name: "preamble", turns: p.Turns, stagger: p.Stagger,
		system: string(text),
		talk:   userTalk{p.FirstUserTokens, p.UserTokens, p.AssistantTokens},
		slots:  make([]*conversation, p.Active)}
}

// newAgent returns the agent workload: the chat engine with a tool-use
// system prompt and sessions that open with a task and grow by a tool call
// and its result a turn.
func newAgent(c *Config, r *rand.Rand) *chat {
	a := &c.Agent
	s := &chat{cfg: c, rng: r, name: "agent", turns: a.Turns, stagger: a.Stagger,
		talk:  agentTalk{a},
		slots: make([]*conversation, a.Active)}
	if a.SystemTokens > 0 {
		sys := "You complete the user's task by calling tools. Reply with one tool call at a time, " +
			"as JSON naming the tool and its input. Tools:"
		for _, t := range agentTools {
			sys += " " + t
		}
		s.system = sys + ".\n" + words(subRand(c.Seed, "agent-system", 0), a.SystemTokens)
	}
	return s
}

// agentTools are the tools the agent's system prompt offers.
var agentTools = []string{"search", "read_file", "write_file", "run_tests", "shell", "fetch_url", "query_db", "list_dir"}

var _ dialogue = agentTalk{}

// agentTalk is an agentic session: the user states a task, then each turn
// adds the assistant's tool call and the tool's result.
type agentTalk struct{ a *AgentConfig }

func (t agentTalk) open(id int, r *rand.Rand) message {
	return message{"user", []string{"Task " + strconv.Itoa(id) + ". " + words(r, t.a.TaskTokens)}}
}

// callWrapTokens is about the tokens of a tool call's JSON around its input
// (`{"tool":"read_file","input":"` and `"}`, 4 bytes a token).
const callWrapTokens = 8

func (t agentTalk) turn(r *rand.Rand, msgs []message) []message {
	a := t.a
	tool := agentTools[r.IntN(len(agentTools))]
	call := `{"tool":"` + tool + `","input":"` + words(r, max(1, a.CallTokens-callWrapTokens)) + `"}`
	n := a.MinResultTokens + r.IntN(a.MaxResultTokens-a.MinResultTokens+1)
	return append(msgs,
		message{"assistant", []string{call}},
		message{"tool", []string{words(r, n)}})
}
