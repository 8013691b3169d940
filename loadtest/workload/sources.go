package workload

import (
	"math/rand/v2"
	"strconv"
)

// rag: a fixed system prompt, then a user message holding one document and
// one of its questions. Documents are drawn by Zipf popularity.
type rag struct {
	cfg       *Config
	rng       *rand.Rand
	pop       *zipf
	system    string
	docs      []string   // lazily generated, with their header line
	questions [][]string // per document, lazily generated
	groups    []string
	msgs      []message
	parts     []string
}

func newRAG(c *Config, r *rand.Rand) *rag {
	n := c.RAG.Documents
	return &rag{
		cfg:       c,
		rng:       r,
		pop:       newZipf(n, c.Zipf),
		system:    "You answer questions about the document the user provides. " + words(subRand(c.Seed, "rag-system", 0), 24),
		docs:      make([]string, n),
		questions: make([][]string, n),
		groups:    make([]string, n),
		msgs:      make([]message, 2),
		parts:     make([]string, 0, 5),
	}
}

func (s *rag) document(d int) string {
	if s.docs[d] == "" {
		r := subRand(s.cfg.Seed, "rag-doc", d)
		s.docs[d] = "Document " + strconv.Itoa(d) + ":\n" + words(r, s.cfg.RAG.DocumentTokens)
		s.groups[d] = "rag/doc-" + strconv.Itoa(d)
	}
	return s.docs[d]
}

func (s *rag) question(d, q int) string {
	if s.questions[d] == nil {
		s.questions[d] = make([]string, s.cfg.RAG.QuestionsPerDoc)
	}
	if s.questions[d][q] == "" {
		r := subRand(s.cfg.Seed, "rag-question", d*s.cfg.RAG.QuestionsPerDoc+q)
		s.questions[d][q] = words(r, s.cfg.RAG.QuestionTokens)
	}
	return s.questions[d][q]
}

func (s *rag) next(r *Request) {
	d := s.pop.draw(s.rng)
	q := s.rng.IntN(s.cfg.RAG.QuestionsPerDoc)
	s.parts = append(s.parts[:0], s.document(d), "\n\nQuestion: ", s.question(d, q))
	s.msgs[0] = message{"system", []string{s.system}}
	s.msgs[1] = message{"user", s.parts}
	r.setChat(s.cfg, s.groups[d], s.msgs)
}

// chat: Active open conversations; each request advances one of them,
// chosen uniformly, by a turn and resends the whole history. Assistant
// replies in the history are written by the generator (a simulated model's
// own words cannot be known in advance, and fixed replies keep runs
// repeatable), so a turn reuses the cache of the previous turn's prompt.
// The preamble and agent workloads run on the same engine with their own
// system prompt and dialogue.
type chat struct {
	cfg *Config
	rng *rand.Rand
	// name is the workload's name: the prefix of its groups and the tag of
	// its conversations' seeds.
	name    string
	system  string
	turns   int
	stagger bool
	talk    dialogue
	slots   []*conversation
	nextID  int
	msgs    []message
}

// A dialogue writes the messages of one kind of conversation.
type dialogue interface {
	// open returns the first message of conversation id.
	open(id int, r *rand.Rand) message
	// turn appends the messages of one more turn to msgs.
	turn(r *rand.Rand, msgs []message) []message
}

type conversation struct {
	id    int
	group string
	rng   *rand.Rand
	turn  int
	msgs  []message // history without the system prompt
}

func newChat(c *Config, r *rand.Rand) *chat {
	h := &c.Chat
	s := &chat{cfg: c, rng: r, name: "chat", turns: h.Turns, stagger: h.Stagger,
		talk:  userTalk{h.FirstUserTokens, h.UserTokens, h.AssistantTokens},
		slots: make([]*conversation, h.Active)}
	if h.SystemTokens > 0 {
		s.system = words(subRand(c.Seed, "chat-system", 0), h.SystemTokens)
	}
	return s
}

var _ dialogue = userTalk{}

// userTalk is a chat between a user and an assistant: the user opens with
// a message naming the conversation, and each turn adds the assistant's
// reply and the user's next message.
type userTalk struct {
	first, user, assistant int // tokens
}

func (t userTalk) open(id int, r *rand.Rand) message {
	return message{"user", []string{"Conversation " + strconv.Itoa(id) + ". " + words(r, t.first)}}
}

func (t userTalk) turn(r *rand.Rand, msgs []message) []message {
	return append(msgs,
		message{"assistant", []string{words(r, t.assistant)}},
		message{"user", []string{words(r, t.user)}})
}

// start opens a new conversation. skip > 0 opens it skip turns in: the
// history of those turns is written but never sent (a conversation resumed
// from an earlier session).
func (s *chat) start(skip int) *conversation {
	id := s.nextID
	s.nextID++
	r := subRand(s.cfg.Seed, s.name+"-conversation", id)
	c := &conversation{
		id:    id,
		group: s.name + "/conv-" + strconv.Itoa(id),
		rng:   r,
		msgs:  []message{s.talk.open(id, r)},
	}
	for ; skip > 0; skip-- {
		c.msgs = s.talk.turn(c.rng, c.msgs)
		c.turn++
	}
	return c
}

func (s *chat) next(r *Request) {
	i := s.rng.IntN(len(s.slots))
	c := s.slots[i]
	switch {
	case c == nil:
		// With stagger, the first conversation of slot i starts i/Active
		// of the way through its turns, so the mix of turns is the same
		// from the first request on as in the long run.
		skip := 0
		if s.stagger {
			skip = i * s.turns / len(s.slots)
		}
		c = s.start(skip)
		s.slots[i] = c
	case c.turn >= s.turns:
		c = s.start(0)
		s.slots[i] = c
	default:
		c.msgs = s.talk.turn(c.rng, c.msgs)
	}
	c.turn++
	s.msgs = s.msgs[:0]
	if s.system != "" {
		s.msgs = append(s.msgs, message{"system", []string{s.system}})
	}
	s.msgs = append(s.msgs, c.msgs...)
	r.setChat(s.cfg, c.group, s.msgs)
}

// bot: the system prompt is one of Templates long policy blocks, drawn by
// Zipf popularity; the user message is the user's own.
type bot struct {
	cfg      *Config
	rng      *rand.Rand
	pop      *zipf
	policies []string
	groups   []string
	msgs     []message
	user     []byte
}

func newBot(c *Config, r *rand.Rand) *bot {
	n := c.Bot.Templates
	return &bot{cfg: c, rng: r, pop: newZipf(n, c.Zipf),
		policies: make([]string, n), groups: make([]string, n), msgs: make([]message, 2)}
}

func (s *bot) policy(t int) string {
	if s.policies[t] == "" {
		r := subRand(s.cfg.Seed, "bot-policy", t)
		s.policies[t] = "Assistant " + strconv.Itoa(t) + " policy and formatting rules:\n" + words(r, s.cfg.Bot.PolicyTokens)
		s.groups[t] = "bot/template-" + strconv.Itoa(t)
	}
	return s.policies[t]
}

func (s *bot) next(r *Request) {
	t := s.pop.draw(s.rng)
	s.user = appendWords(s.user[:0], s.rng, s.cfg.Bot.UserTokens)
	s.msgs[0] = message{"system", []string{s.policy(t)}}
	s.msgs[1] = message{"user", []string{string(s.user)}}
	r.setChat(s.cfg, s.groups[t], s.msgs)
}

// code: the prompt of /v1/completions is a file up to a cursor (a line
// start at or after MinCursor of the file) plus a short edit typed there.
type code struct {
	cfg    *Config
	rng    *rand.Rand
	pop    *zipf
	files  []string
	lines  [][]int // per file, offsets of line starts
	groups []string
	edit   []byte
	parts  []string
}

func newCode(c *Config, r *rand.Rand) *code {
	n := c.Code.Files
	return &code{cfg: c, rng: r, pop: newZipf(n, c.Zipf),
		files: make([]string, n), lines: make([][]int, n), groups: make([]string, n),
		parts: make([]string, 0, 2)}
}

func (s *code) file(f int) (string, []int) {
	if s.files[f] == "" {
		r := subRand(s.cfg.Seed, "code-file", f)
		name := vocabulary[r.IntN(len(vocabulary))] + "/" + vocabulary[r.IntN(len(vocabulary))]
		text := "// file " + strconv.Itoa(f) + ": " + name + ".go\npackage " +
			vocabulary[r.IntN(len(vocabulary))] + "\n\n" + codeText(r, s.cfg.Code.FileTokens)
		var starts []int
		for i := 0; i < len(text); i++ {
			if text[i] == '\n' && i+1 < len(text) {
				starts = append(starts, i+1)
			}
		}
		s.files[f], s.lines[f], s.groups[f] = text, starts, "code/file-"+strconv.Itoa(f)
	}
	return s.files[f], s.lines[f]
}

func (s *code) next(r *Request) {
	f := s.pop.draw(s.rng)
	text, starts := s.file(f)
	// the first line start at or after MinCursor of the file
	lo := len(starts)
	min := int(s.cfg.Code.MinCursor * float64(len(text)))
	for i, off := range starts {
		if off >= min {
			lo = i
			break
		}
	}
	cursor := len(text)
	if lo < len(starts) {
		if k := lo + s.rng.IntN(len(starts)-lo+1); k < len(starts) {
			cursor = starts[k]
		}
	}
	s.edit = appendWords(s.edit[:0], s.rng, s.cfg.Code.EditTokens)
	s.parts = append(s.parts[:0], text[:cursor], string(s.edit))
	r.Path = PathCompletions
	r.Group = s.groups[f]
	r.Body = appendCompletionBody(r.Body[:0], s.cfg, s.parts, r.Tenant)
}

// noReuse: a user message that differs from the first character on.
type noReuse struct {
	cfg   *Config
	rng   *rand.Rand
	n     int
	text  []byte
	msgs  []message
	parts []string
}

func newNoReuse(c *Config, r *rand.Rand) *noReuse {
	return &noReuse{cfg: c, rng: r, msgs: make([]message, 1), parts: make([]string, 1)}
}

func (s *noReuse) next(r *Request) {
	// a random word first, then a number: no two prompts share even a
	// short prefix beyond chance.
	s.text = s.text[:0]
	s.text = strconv.AppendUint(s.text, s.rng.Uint64(), 36)
	s.text = append(s.text, ' ')
	s.text = strconv.AppendInt(s.text, int64(s.n), 10)
	s.text = append(s.text, ". "...)
	s.n++
	s.text = appendWords(s.text, s.rng, s.cfg.NoReuse.PromptTokens)
	s.parts[0] = string(s.text)
	s.msgs[0] = message{"user", s.parts}
	r.setChat(s.cfg, "", s.msgs)
}
