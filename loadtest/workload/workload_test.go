package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
)

type chatBody struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	Prompt        string `json:"prompt"`
	MaxTokens     int    `json:"max_tokens"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	PromptCacheKey string `json:"prompt_cache_key"`
}

// prompt is the text a router hashes: the messages' roles and contents in
// order, or the completion prompt.
func (b chatBody) prompt() string {
	if b.Prompt != "" {
		return b.Prompt
	}
	var s strings.Builder
	for _, m := range b.Messages {
		s.WriteString(m.Role)
		s.WriteByte(0)
		s.WriteString(m.Content)
		s.WriteByte(0)
	}
	return s.String()
}

type sample struct {
	req  Request
	body chatBody
}

func generate(t *testing.T, c Config, n int) []sample {
	t.Helper()
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]sample, n)
	var r Request
	for i := range out {
		g.Next(&r)
		out[i].req = r
		out[i].req.Body = bytes.Clone(r.Body)
		if err := json.Unmarshal(r.Body, &out[i].body); err != nil {
			t.Fatalf("request %d (%s): body is not JSON: %v\n%.200s", i, r.Kind, err, r.Body)
		}
		if r.Seq != i {
			t.Fatalf("request %d has Seq %d", i, r.Seq)
		}
	}
	return out
}

func kindConfig(k Kind) Config {
	c := DefaultConfig()
	c.Kind = k
	// small sizes keep the tests fast
	c.RAG.DocumentTokens = 300
	c.Chat.FirstUserTokens = 100
	c.Bot.PolicyTokens = 500
	c.Code.FileTokens = 400
	c.NoReuse.PromptTokens = 200
	c.SysPrompt.MinChars, c.SysPrompt.MaxChars = 200, 600
	c.Preamble.Chars, c.Preamble.FirstUserTokens, c.Preamble.AssistantTokens = 3000, 60, 30
	c.Agent.SystemTokens, c.Agent.TaskTokens = 100, 40
	c.Agent.MinResultTokens, c.Agent.MaxResultTokens = 20, 200
	return c
}

// chatConfig is the chat workload of kindConfig with active conversations
// of turns turns.
func chatConfig(active, turns int, stagger bool) Config {
	c := kindConfig(KindChat)
	c.Chat.Active = active
	c.Chat.Turns = turns
	c.Chat.Stagger = stagger
	return c
}

func TestSameSeedSameRequests(t *testing.T) {
	for _, k := range Kinds() {
		t.Run(string(k), func(t *testing.T) {
			c := kindConfig(k)
			c.Tenants = 3
			a := generate(t, c, 300)
			b := generate(t, c, 300)
			for i := range a {
				if !bytes.Equal(a[i].req.Body, b[i].req.Body) || a[i].req.Group != b[i].req.Group ||
					a[i].req.Path != b[i].req.Path || a[i].req.Kind != b[i].req.Kind {
					t.Fatalf("request %d differs between two generators with the same config", i)
				}
			}
			c.Seed++
			d := generate(t, c, 300)
			same := 0
			for i := range a {
				if bytes.Equal(a[i].req.Body, d[i].req.Body) {
					same++
				}
			}
			if same > 30 {
				t.Fatalf("%d of 300 requests identical under a different seed", same)
			}
		})
	}
}

func TestBodiesCarryConfig(t *testing.T) {
	for _, k := range Kinds() {
		c := kindConfig(k)
		c.MaxTokens = 17
		c.Model = `m"odel`
		for _, s := range generate(t, c, 50) {
			b := s.body
			if b.Model != c.Model || b.MaxTokens != 17 || !b.Stream || b.StreamOptions == nil || !b.StreamOptions.IncludeUsage {
				t.Fatalf("%s: body does not carry the config: %+v", k, b)
			}
			if b.PromptCacheKey != "" {
				t.Fatalf("%s: prompt_cache_key %q without tenants", k, b.PromptCacheKey)
			}
			wantPath := PathChat
			if s.req.Kind == KindCode {
				wantPath = PathCompletions
				if b.Prompt == "" || len(b.Messages) != 0 {
					t.Fatalf("code request is not a completion: %+v", b)
				}
			} else if len(b.Messages) == 0 {
				t.Fatalf("%s request has no messages", s.req.Kind)
			}
			if s.req.Path != wantPath {
				t.Fatalf("%s request path %s", s.req.Kind, s.req.Path)
			}
		}
	}
	c := kindConfig(KindRAG)
	c.Stream = false
	for _, s := range generate(t, c, 5) {
		if s.body.Stream || s.body.StreamOptions != nil {
			t.Fatal("stream set though Stream is false")
		}
		if bytes.Contains(s.req.Body, []byte(`"model"`)) {
			t.Fatal("model field present though Model is empty")
		}
	}
}

func countWords(s string) int { return len(strings.Fields(s)) }

func near(got, want int, tol float64) bool {
	return math.Abs(float64(got-want)) <= tol*float64(want)+2
}

func TestRAGSharing(t *testing.T) {
	c := kindConfig(KindRAG)
	c.RAG.Documents = 5
	c.RAG.QuestionsPerDoc = 3
	ss := generate(t, c, 400)
	docOf := map[string]string{} // group -> document part of the user message
	questions := map[string]map[string]bool{}
	system := ss[0].body.Messages[0].Content
	for _, s := range ss {
		m := s.body.Messages
		if len(m) != 2 || m[0].Role != "system" || m[1].Role != "user" || m[0].Content != system {
			t.Fatalf("RAG request is not [shared system, user]: %+v", m)
		}
		doc, q, ok := strings.Cut(m[1].Content, "\n\nQuestion: ")
		if !ok {
			t.Fatalf("no question in %.80q", m[1].Content)
		}
		g := s.req.Group
		if prev, seen := docOf[g]; seen && prev != doc {
			t.Fatalf("group %s has two different documents", g)
		}
		docOf[g] = doc
		if questions[g] == nil {
			questions[g] = map[string]bool{}
		}
		questions[g][q] = true
		if !near(countWords(doc), c.RAG.DocumentTokens, 0.02) || !near(countWords(q), c.RAG.QuestionTokens, 0.02) {
			t.Fatalf("sizes: document %d words (want ~%d), question %d (want ~%d)",
				countWords(doc), c.RAG.DocumentTokens, countWords(q), c.RAG.QuestionTokens)
		}
	}
	if len(docOf) != 5 {
		t.Fatalf("%d documents used, want 5", len(docOf))
	}
	seen := map[string]string{}
	for g, d := range docOf {
		// documents differ within their first line, so a short routing
		// prefix already tells them apart
		head := d[:20]
		if other, dup := seen[head]; dup {
			t.Fatalf("groups %s and %s share their first 20 characters", g, other)
		}
		seen[head] = g
		if len(questions[g]) != 3 {
			t.Fatalf("group %s: %d distinct questions, want 3", g, len(questions[g]))
		}
	}
}

func TestChatHistoryGrows(t *testing.T) {
	c := chatConfig(4, 5, false)
	ss := generate(t, c, 200)
	last := map[string]chatBody{}
	turns := map[string]int{}
	for _, s := range ss {
		g := s.req.Group
		m := s.body.Messages
		if m[0].Role != "system" || m[0].Content != ss[0].body.Messages[0].Content {
			t.Fatal("chat requests do not share the system prompt")
		}
		turns[g]++
		if want := 2 * turns[g]; len(m) != want {
			t.Fatalf("group %s turn %d has %d messages, want %d", g, turns[g], len(m), want)
		}
		if prev, ok := last[g]; ok {
			// the previous request's messages are a prefix of this one's
			for i, pm := range prev.Messages {
				if m[i] != pm {
					t.Fatalf("group %s turn %d does not resend message %d of turn %d", g, turns[g], i, turns[g]-1)
				}
			}
			if m[len(m)-2].Role != "assistant" || m[len(m)-1].Role != "user" {
				t.Fatalf("turn adds %s, %s; want assistant, user", m[len(m)-2].Role, m[len(m)-1].Role)
			}
		} else if !strings.HasPrefix(m[1].Content, "Conversation ") {
			t.Fatalf("first turn of %s does not open with the conversation's own text", g)
		}
		last[g] = s.body
	}
	for g, n := range turns {
		if n > c.Chat.Turns {
			t.Fatalf("conversation %s ran %d turns, limit %d", g, n, c.Chat.Turns)
		}
	}
	if len(turns) < 200/c.Chat.Turns {
		t.Fatalf("only %d conversations in 200 requests of %d turns", len(turns), c.Chat.Turns)
	}
}

func TestBotSharesPolicy(t *testing.T) {
	c := kindConfig(KindBot)
	c.Bot.Templates = 3
	ss := generate(t, c, 150)
	policy := map[string]string{}
	users := map[string]bool{}
	for _, s := range ss {
		m := s.body.Messages
		if p, ok := policy[s.req.Group]; ok && p != m[0].Content {
			t.Fatalf("template %s sent two policies", s.req.Group)
		}
		policy[s.req.Group] = m[0].Content
		if !near(countWords(m[0].Content), c.Bot.PolicyTokens, 0.02) {
			t.Fatalf("policy of %d words, want ~%d", countWords(m[0].Content), c.Bot.PolicyTokens)
		}
		users[m[1].Content] = true
	}
	if len(policy) != 3 {
		t.Fatalf("%d templates used, want 3", len(policy))
	}
	if len(users) < 148 {
		t.Fatalf("only %d distinct user messages in 150 requests", len(users))
	}
}

func TestCodeSharesFilePrefix(t *testing.T) {
	c := kindConfig(KindCode)
	c.Code.Files = 4
	c.Code.MinCursor = 0.6
	ss := generate(t, c, 200)
	byGroup := map[string][]string{}
	for _, s := range ss {
		byGroup[s.req.Group] = append(byGroup[s.req.Group], s.body.Prompt)
	}
	if len(byGroup) != 4 {
		t.Fatalf("%d files used, want 4", len(byGroup))
	}
	cursors := map[int]bool{}
	for g, ps := range byGroup {
		for _, p := range ps[1:] {
			n := commonPrefix(ps[0], p)
			if n < int(0.6*float64(len(ps[0])-50))-10 {
				t.Fatalf("file %s: two prompts share only %d of %d characters", g, n, len(ps[0]))
			}
			cursors[n] = true
		}
	}
	if len(cursors) < 10 {
		t.Fatalf("cursor positions barely vary: %d distinct shared lengths", len(cursors))
	}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestNoReuseSharesNothing(t *testing.T) {
	c := kindConfig(KindNoReuse)
	ss := generate(t, c, 300)
	for i := 1; i < len(ss); i++ {
		if ss[i].req.Group != "" {
			t.Fatal("no-reuse request has a group")
		}
		for j := 0; j < i; j++ {
			a, b := ss[i].body.Messages[0].Content, ss[j].body.Messages[0].Content
			if n := commonPrefix(a, b); n > 12 {
				t.Fatalf("requests %d and %d share %d leading characters", i, j, n)
			}
		}
	}
	if !near(countWords(ss[0].body.Messages[0].Content), c.NoReuse.PromptTokens, 0.02) {
		t.Fatalf("prompt of %d words, want ~%d", countWords(ss[0].body.Messages[0].Content), c.NoReuse.PromptTokens)
	}
}

func TestTenantsSendIdenticalPrompts(t *testing.T) {
	c := kindConfig(KindRAG)
	c.RAG.Documents = 2
	c.RAG.QuestionsPerDoc = 1
	c.Tenants = 3
	ss := generate(t, c, 60)
	tenantsPerPrompt := map[string]map[string]bool{}
	for _, s := range ss {
		if s.body.PromptCacheKey != s.req.Tenant || s.req.Tenant == "" {
			t.Fatalf("prompt_cache_key %q, Request.Tenant %q", s.body.PromptCacheKey, s.req.Tenant)
		}
		p := s.body.prompt()
		if tenantsPerPrompt[p] == nil {
			tenantsPerPrompt[p] = map[string]bool{}
		}
		tenantsPerPrompt[p][s.req.Tenant] = true
	}
	if len(tenantsPerPrompt) != 2 {
		t.Fatalf("%d distinct prompts, want 2", len(tenantsPerPrompt))
	}
	for _, ts := range tenantsPerPrompt {
		if len(ts) != 3 {
			t.Fatalf("a prompt was sent by %d tenants, want all 3", len(ts))
		}
	}
}

func TestZipfPopularity(t *testing.T) {
	c := kindConfig(KindRAG)
	c.RAG.Documents = 10
	c.RAG.DocumentTokens = 10
	c.Zipf = 1.2
	const n = 20000
	ss := generate(t, c, n)
	counts := map[string]int{}
	for _, s := range ss {
		counts[s.req.Group]++
	}
	z := newZipf(10, 1.2)
	for i := 0; i < 10; i++ {
		got := float64(counts["rag/doc-"+itoa(i)]) / n
		want := z.prob(i)
		if math.Abs(got-want) > 0.015 {
			t.Errorf("document %d drawn %.3f of the time, want %.3f", i, got, want)
		}
	}
	if counts["rag/doc-0"] < 4*counts["rag/doc-9"] {
		t.Errorf("no skew: first %d, last %d", counts["rag/doc-0"], counts["rag/doc-9"])
	}
	// s = 0 is uniform
	u := newZipf(4, 0)
	for i := 0; i < 4; i++ {
		if math.Abs(u.prob(i)-0.25) > 1e-12 {
			t.Fatalf("uniform prob %d = %g", i, u.prob(i))
		}
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func TestMixWeights(t *testing.T) {
	c := kindConfig(KindMix)
	c.Mix = []Weight{{KindRAG, 3}, {KindNoReuse, 1}, {KindBot, 0}}
	ss := generate(t, c, 4000)
	counts := map[Kind]int{}
	for _, s := range ss {
		counts[s.req.Kind]++
	}
	if counts[KindBot] != 0 || len(counts) != 2 {
		t.Fatalf("kinds drawn: %v", counts)
	}
	if f := float64(counts[KindRAG]) / 4000; math.Abs(f-0.75) > 0.03 {
		t.Fatalf("rag fraction %.3f, want 0.75", f)
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.Kind = "nope" },
		func(c *Config) { c.MaxTokens = 0 },
		func(c *Config) { c.Tenants = -1 },
		func(c *Config) { c.Zipf = -0.5 },
		func(c *Config) { c.RAG.Documents = 0 },
		func(c *Config) { c.Kind = KindChat; c.Chat.Turns = 0 },
		func(c *Config) { c.Kind = KindCode; c.Code.MinCursor = 1.5 },
		func(c *Config) { c.Kind = KindMix; c.Mix = nil },
		func(c *Config) { c.Kind = KindMix; c.Mix = []Weight{{KindRAG, 0}} },
		func(c *Config) { c.Kind = KindMix; c.Mix = []Weight{{KindMix, 1}} },
		func(c *Config) { c.Kind = KindMix; c.Bot.PolicyTokens = 0 },
	}
	for i, mut := range bad {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: invalid config accepted", i)
		} else if !errors.Is(err, ErrBadConfig) && !errors.Is(err, ErrUnknownKind) {
			t.Errorf("case %d: error %v is not a sentinel", i, err)
		}
		if _, err := New(c); err == nil {
			t.Errorf("case %d: New accepted an invalid config", i)
		}
	}
	for _, k := range Kinds() {
		c := DefaultConfig()
		c.Kind = k
		if err := c.Validate(); err != nil {
			t.Errorf("default %s: %v", k, err)
		}
	}
}

func TestParseMix(t *testing.T) {
	ws, err := ParseMix(" rag=2, chat=1.5 ,noreuse=0")
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatMix(ws); got != "chat=1.5,noreuse=0,rag=2" {
		t.Fatalf("round trip: %s", got)
	}
	for _, s := range []string{"", "rag", "rag=x", "mix=1", "foo=1", "rag=-1"} {
		if _, err := ParseMix(s); err == nil {
			t.Errorf("ParseMix(%q) accepted", s)
		}
	}
}

func TestSharedTokens(t *testing.T) {
	c := DefaultConfig()
	c.RAG.Documents, c.RAG.DocumentTokens = 10, 1000
	if got := c.SharedTokens(); got != 10000 {
		t.Fatalf("rag working set %d, want 10000", got)
	}
	c.Kind = KindChat
	c.Chat = ChatConfig{Active: 2, Turns: 3, SystemTokens: 10, FirstUserTokens: 100, UserTokens: 20, AssistantTokens: 30}
	if got := c.SharedTokens(); got != 2*(10+100+50) {
		t.Fatalf("chat working set %d, want %d", got, 2*(10+100+50))
	}
	c.Kind = KindNoReuse
	if got := c.SharedTokens(); got != 0 {
		t.Fatalf("no-reuse working set %d", got)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "a\"b\\c\n\r\t", "\x00\x1f", "é\u2028\u2029", "\xff\xfe", "<>&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q renders invalid JSON %s: %v", s, b, err)
		}
		want := string([]rune(s)) // one U+FFFD per invalid byte
		if got != want {
			t.Fatalf("round trip of %q gives %q", s, got)
		}
	})
}

func BenchmarkNext(b *testing.B) {
	for _, k := range []Kind{KindRAG, KindChat, KindBot, KindSysPrompt, KindPreamble, KindAgent} {
		b.Run(string(k), func(b *testing.B) {
			g, err := New(DefaultConfig().withKind(k))
			if err != nil {
				b.Fatal(err)
			}
			var r Request
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				g.Next(&r)
			}
			b.SetBytes(int64(len(r.Body)))
		})
	}
}

func (c Config) withKind(k Kind) Config { c.Kind = k; return c }

func TestBindFlags(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.BindFlags(fs)
	err := fs.Parse([]string{"--workload", "mix", "--mix", "rag=1,code=2", "--rag-docs", "9", "--zipf", "0.8",
		"--chat-turns", "3", "--code-min-cursor", "0.25", "--stream=false", "--tenants", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != KindMix || FormatMix(c.Mix) != "code=2,rag=1" || c.RAG.Documents != 9 || c.Zipf != 0.8 ||
		c.Chat.Turns != 3 || c.Code.MinCursor != 0.25 || c.Stream || c.Tenants != 2 {
		t.Fatalf("flags not applied: %+v", c)
	}
	for _, bad := range [][]string{{"--workload", "poems"}, {"--mix", "rag"}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		d := DefaultConfig()
		d.BindFlags(fs)
		if err := fs.Parse(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestChatStagger(t *testing.T) {
	c := chatConfig(5, 10, true)
	ss := generate(t, c, 400)
	// the first request of each of the first conversations carries the
	// history of the turns it skipped: 2 x (i x 10 / 5) + 2 messages for
	// slot i, so the first five conversations open with different lengths
	first := map[string]int{}
	seen := map[int]bool{}
	for _, s := range ss {
		if _, ok := first[s.req.Group]; ok {
			continue
		}
		first[s.req.Group] = len(s.body.Messages)
		var id int
		fmt.Sscanf(s.req.Group, "chat/conv-%d", &id)
		if id < 5 {
			seen[len(s.body.Messages)] = true
		} else if len(s.body.Messages) != 2 {
			t.Fatalf("later conversation %s opens with %d messages", s.req.Group, len(s.body.Messages))
		}
	}
	for _, n := range []int{2, 6, 10, 14, 18} {
		if !seen[n] {
			t.Fatalf("no initial conversation opens with %d messages: %v", n, seen)
		}
	}
	// turn counts still stop at Turns: a conversation that started at
	// turn 9 sends 1 request
	count := map[string]int{}
	for _, s := range ss {
		count[s.req.Group]++
	}
	for g, n := range count {
		if start := first[g]/2 - 1; start+n > c.Chat.Turns {
			t.Fatalf("%s sent %d turns after starting at %d", g, n, start)
		}
	}
}

// messagesEnd returns the body up to the end of its messages array: what a
// later turn of the same conversation must resend byte for byte.
func messagesEnd(t *testing.T, body []byte) []byte {
	t.Helper()
	i := bytes.Index(body, []byte(`],"max_tokens"`))
	if i < 0 {
		t.Fatalf("no end of messages in %.80s", body)
	}
	return body[:i]
}

func TestSysPromptSharing(t *testing.T) {
	c := kindConfig(KindSysPrompt)
	c.SysPrompt.Prompts = 40
	ss := generate(t, c, 3000)
	prompt := map[string]string{}
	users := map[string]bool{}
	lengths := map[int]bool{}
	for _, s := range ss {
		m := s.body.Messages
		if len(m) != 2 || m[0].Role != "system" || m[1].Role != "user" {
			t.Fatalf("sysprompt request is not [system, user]: %+v", m)
		}
		g := s.req.Group
		if !strings.HasPrefix(g, "sysprompt/prompt-") {
			t.Fatalf("group %q", g)
		}
		if p, ok := prompt[g]; ok && p != m[0].Content {
			t.Fatalf("group %s sent two different system prompts", g)
		}
		prompt[g] = m[0].Content
		if n := len(m[0].Content); n < c.SysPrompt.MinChars || n > c.SysPrompt.MaxChars {
			t.Fatalf("system prompt of %d characters outside %d-%d", n, c.SysPrompt.MinChars, c.SysPrompt.MaxChars)
		}
		lengths[len(m[0].Content)] = true
		if !near(countWords(m[1].Content), c.SysPrompt.QuestionTokens, 0.02) {
			t.Fatalf("question of %d words, want ~%d", countWords(m[1].Content), c.SysPrompt.QuestionTokens)
		}
		if users[m[1].Content] {
			t.Fatalf("request %d repeats an earlier question", s.req.Seq)
		}
		users[m[1].Content] = true
	}
	if len(prompt) < 35 {
		t.Fatalf("only %d of 40 prompts used in 3000 requests", len(prompt))
	}
	if len(lengths) < len(prompt)*3/4 {
		t.Fatalf("prompt lengths barely vary: %d distinct lengths for %d prompts", len(lengths), len(prompt))
	}
	// distinct prompts differ within their first 64 bytes, so a short
	// routing prefix already tells them apart
	heads := map[string]string{}
	for g, p := range prompt {
		if other, dup := heads[p[:64]]; dup {
			t.Fatalf("groups %s and %s share their first 64 bytes", g, other)
		}
		heads[p[:64]] = g
	}
}

func TestSysPromptZipf(t *testing.T) {
	c := kindConfig(KindSysPrompt)
	c.SysPrompt.Prompts = 16
	c.SysPrompt.MaxChars = 200
	c.SysPrompt.QuestionTokens = 2
	const n = 10000
	ss := generate(t, c, n)
	counts := map[string]int{}
	for _, s := range ss {
		counts[s.req.Group]++
	}
	z := newZipf(16, c.SysPrompt.Zipf)
	for i := 0; i < 16; i++ {
		got := float64(counts["sysprompt/prompt-"+strconv.Itoa(i)]) / n
		if want := z.prob(i); math.Abs(got-want) > 0.015 {
			t.Errorf("prompt %d drawn %.3f of the time, want %.3f", i, got, want)
		}
	}
	if first, last := counts["sysprompt/prompt-0"], counts["sysprompt/prompt-15"]; first < 10*last {
		t.Errorf("no skew: first %d, last %d", first, last)
	}
	// the global --zipf does not apply; the workload's own skew does
	c.Zipf, c.SysPrompt.Zipf = 3, 0
	counts = map[string]int{}
	for _, s := range generate(t, c, 4000) {
		counts[s.req.Group]++
	}
	for g, k := range counts {
		if math.Abs(float64(k)/4000-1.0/16) > 0.025 {
			t.Errorf("uniform sysprompt: %s drawn %d of 4000 times", g, k)
		}
	}
}

func TestPreambleSharing(t *testing.T) {
	c := kindConfig(KindPreamble)
	c.Preamble.Active, c.Preamble.Turns, c.Preamble.Stagger = 6, 5, false
	c.Preamble.Chars = DefaultConfig().Preamble.Chars
	if c.Preamble.Chars != 12288 {
		t.Fatalf("default preamble of %d characters, want 12288", c.Preamble.Chars)
	}
	ss := generate(t, c, 300)
	preamble := ss[0].body.Messages[0].Content
	if len(preamble) != 12288 {
		t.Fatalf("preamble of %d characters, want 12288", len(preamble))
	}
	head := ss[0].body.prompt()[:12288]
	last := map[string]sample{}
	turns := map[string]int{}
	firsts := map[string]string{}
	for _, s := range ss {
		m := s.body.Messages
		if m[0].Role != "system" || m[0].Content != preamble {
			t.Fatalf("request %d does not open with the preamble", s.req.Seq)
		}
		if !strings.HasPrefix(s.body.prompt(), head) {
			t.Fatalf("request %d does not start with the same 12,288 characters", s.req.Seq)
		}
		g := s.req.Group
		turns[g]++
		if want := 2 * turns[g]; len(m) != want {
			t.Fatalf("group %s turn %d has %d messages, want %d", g, turns[g], len(m), want)
		}
		if prev, ok := last[g]; ok {
			if !bytes.HasPrefix(s.req.Body, messagesEnd(t, prev.req.Body)) {
				t.Fatalf("group %s turn %d does not extend turn %d byte for byte", g, turns[g], turns[g]-1)
			}
			if !strings.HasPrefix(s.body.prompt(), prev.body.prompt()) {
				t.Fatalf("group %s turn %d does not extend the prompt text of turn %d", g, turns[g], turns[g]-1)
			}
		} else {
			first := m[1].Content
			if m[1].Role != "user" || !strings.HasPrefix(first, "Conversation ") {
				t.Fatalf("conversation %s does not open with its own user message right after the preamble", g)
			}
			if !near(countWords(first), c.Preamble.FirstUserTokens+2, 0.02) {
				t.Fatalf("first message of %d words, want ~%d", countWords(first), c.Preamble.FirstUserTokens)
			}
			firsts[g] = first
		}
		last[g] = s
	}
	for g, n := range turns {
		if n > c.Preamble.Turns {
			t.Fatalf("conversation %s ran %d turns, limit %d", g, n, c.Preamble.Turns)
		}
	}
	if len(turns) < 300/c.Preamble.Turns {
		t.Fatalf("only %d conversations in 300 requests of %d turns", len(turns), c.Preamble.Turns)
	}
	// conversations differ from their first user message on
	seen := map[string]string{}
	for g, f := range firsts {
		if other, dup := seen[f[:24]]; dup {
			t.Fatalf("conversations %s and %s open with the same 24 characters", g, other)
		}
		seen[f[:24]] = g
	}
	// a different seed writes another preamble, of the same length
	c.Seed++
	other := generate(t, c, 1)[0].body.Messages[0].Content
	if len(other) != 12288 || other == preamble {
		t.Fatalf("preamble under another seed: %d characters, same text %v", len(other), other == preamble)
	}
}

func TestAgentSessions(t *testing.T) {
	c := kindConfig(KindAgent)
	c.Agent.Active, c.Agent.Turns, c.Agent.Stagger = 5, 6, false
	ss := generate(t, c, 400)
	system := ss[0].body.Messages[0].Content
	last := map[string]sample{}
	turns := map[string]int{}
	completed := 0
	results := map[int]bool{}
	for _, s := range ss {
		m := s.body.Messages
		if m[0].Role != "system" || m[0].Content != system {
			t.Fatalf("request %d does not share the tool-use system prompt", s.req.Seq)
		}
		if m[1].Role != "user" || !strings.HasPrefix(m[1].Content, "Task ") {
			t.Fatalf("request %d does not state its session's task after the system prompt", s.req.Seq)
		}
		g := s.req.Group
		turns[g]++
		if want := 2 * turns[g]; len(m) != want {
			t.Fatalf("session %s turn %d has %d messages, want %d", g, turns[g], len(m), want)
		}
		if prev, ok := last[g]; ok {
			if !bytes.HasPrefix(s.req.Body, messagesEnd(t, prev.req.Body)) {
				t.Fatalf("session %s turn %d does not extend turn %d byte for byte", g, turns[g], turns[g]-1)
			}
			call, result := m[len(m)-2], m[len(m)-1]
			if call.Role != "assistant" || result.Role != "tool" {
				t.Fatalf("turn adds %s, %s; want assistant, tool", call.Role, result.Role)
			}
			if !strings.HasPrefix(call.Content, `{"tool":"`) || !near(len(call.Content)/4, c.Agent.CallTokens, 0.25) {
				t.Fatalf("tool call of %d bytes (want ~%d tokens): %.60q", len(call.Content), c.Agent.CallTokens, call.Content)
			}
			n := countWords(result.Content)
			if n < c.Agent.MinResultTokens || n > c.Agent.MaxResultTokens {
				t.Fatalf("tool result of %d words outside %d-%d", n, c.Agent.MinResultTokens, c.Agent.MaxResultTokens)
			}
			results[n] = true
		}
		if turns[g] == c.Agent.Turns {
			completed++
		}
		if turns[g] > c.Agent.Turns {
			t.Fatalf("session %s ran %d turns, limit %d", g, turns[g], c.Agent.Turns)
		}
		// sessions are replaced only when done: never more than Active open
		if open := len(turns) - completed; open > c.Agent.Active {
			t.Fatalf("%d sessions open at request %d, limit %d", open, s.req.Seq, c.Agent.Active)
		}
		last[g] = s
	}
	if completed < 400/c.Agent.Turns-2*c.Agent.Active {
		t.Fatalf("only %d sessions completed in 400 requests", completed)
	}
	if len(results) < 50 {
		t.Fatalf("tool result sizes barely vary: %d distinct", len(results))
	}
}

func TestAgentStagger(t *testing.T) {
	c := kindConfig(KindAgent)
	c.Agent.Active, c.Agent.Turns = 4, 8
	ss := generate(t, c, 200)
	// slot i's first session opens i x 8 / 4 turns in: 3 + 2 x (0, 2, 4, 6)
	// messages with the system prompt
	opening := map[int]bool{}
	seen := map[string]bool{}
	for _, s := range ss {
		if seen[s.req.Group] {
			continue
		}
		seen[s.req.Group] = true
		var id int
		fmt.Sscanf(s.req.Group, "agent/conv-%d", &id)
		if id < 4 {
			opening[len(s.body.Messages)] = true
		} else if len(s.body.Messages) != 2 {
			t.Fatalf("later session %s opens with %d messages", s.req.Group, len(s.body.Messages))
		}
	}
	for _, n := range []int{2, 6, 10, 14} {
		if !opening[n] {
			t.Fatalf("no initial session opens with %d messages: %v", n, opening)
		}
	}
}

func TestLongPrefixValidate(t *testing.T) {
	cases := []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.SysPrompt.Prompts = 0 }, "sysprompt prompts 0 outside"},
		{func(c *Config) { c.SysPrompt.MinChars = 10 }, "sysprompt min chars 10 outside 32-"},
		{func(c *Config) { c.SysPrompt.MinChars = 7000 }, "sysprompt min chars 7000 > max chars 6000"},
		{func(c *Config) { c.SysPrompt.QuestionTokens = 0 }, "sysprompt question tokens 0 outside"},
		{func(c *Config) { c.SysPrompt.Zipf = -1 }, "sysprompt zipf -1 outside 0-10"},
		{func(c *Config) { c.Preamble.Chars = 0 }, "preamble chars 0 outside"},
		{func(c *Config) { c.Preamble.Active = 0 }, "preamble active conversations 0 outside"},
		{func(c *Config) { c.Preamble.Turns = 2000 }, "preamble turns 2000 outside 1-1024"},
		{func(c *Config) { c.Preamble.UserTokens = -3 }, "preamble user tokens -3 outside"},
		{func(c *Config) { c.Agent.Active = 0 }, "agent active sessions 0 outside"},
		{func(c *Config) { c.Agent.Turns = 0 }, "agent turns 0 outside"},
		{func(c *Config) { c.Agent.SystemTokens = -1 }, "agent system tokens -1 outside"},
		{func(c *Config) { c.Agent.CallTokens = 0 }, "agent call tokens 0 outside"},
		{func(c *Config) { c.Agent.MinResultTokens = 0 }, "agent min result tokens 0 outside"},
		{func(c *Config) { c.Agent.MaxResultTokens = 50 }, "agent min result tokens 100 > max result tokens 50"},
	}
	for _, tc := range cases {
		kind := Kind(strings.Fields(tc.want)[0])
		c := DefaultConfig().withKind(kind)
		tc.mut(&c)
		err := c.Validate()
		if err == nil || !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an ErrBadConfig naming %q", kind, err, tc.want)
		}
		// a section is checked when its kind is in a mix, not otherwise
		c.Kind, c.Mix = KindMix, []Weight{{KindRAG, 1}, {kind, 1}}
		if err := c.Validate(); err == nil {
			t.Errorf("%s: mix with an invalid %s section accepted", tc.want, kind)
		}
		c.Mix = []Weight{{KindRAG, 1}}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: mix without %s rejected: %v", tc.want, kind, err)
		}
	}
}

func TestLongPrefixSharedTokens(t *testing.T) {
	c := kindConfig(KindSysPrompt)
	c.SysPrompt.Prompts = 12
	// the estimate counts every prompt's generated length, 4 characters a
	// token
	s := newSysPrompt(&c, subRand(c.Seed, "x", 0))
	chars := 0
	for i := 0; i < 12; i++ {
		chars += len(s.prompt(i))
	}
	if got := c.SharedTokens(); got != (chars+3)/4 {
		t.Fatalf("sysprompt working set %d, want %d", got, (chars+3)/4)
	}
	c.Kind = KindPreamble
	c.Preamble = PreambleConfig{Chars: 12288, Active: 10, Turns: 5, FirstUserTokens: 100, UserTokens: 20, AssistantTokens: 30}
	if got, want := c.SharedTokens(), 3072+10*(100+4*50/2); got != want {
		t.Fatalf("preamble working set %d, want %d", got, want)
	}
	c.Kind = KindAgent
	c.Agent = AgentConfig{Active: 4, Turns: 3, SystemTokens: 1500, TaskTokens: 200, CallTokens: 50, MinResultTokens: 100, MaxResultTokens: 1500}
	if got, want := c.SharedTokens(), 1500+4*(200+2*850/2); got != want {
		t.Fatalf("agent working set %d, want %d", got, want)
	}
	c.Kind, c.Mix = KindMix, []Weight{{KindAgent, 1}, {KindPreamble, 2}}
	if got, want := c.SharedTokens(), 1500+4*(200+850)+3072+10*200; got != want {
		t.Fatalf("mix working set %d, want %d", got, want)
	}
}

func TestLongPrefixFlags(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.BindFlags(fs)
	err := fs.Parse([]string{"--workload", "agent",
		"--sysprompt-prompts", "9", "--sysprompt-min-chars", "100", "--sysprompt-max-chars", "900",
		"--sysprompt-question-tokens", "7", "--sysprompt-zipf", "0.5",
		"--preamble-chars", "20000", "--preamble-active", "11", "--preamble-turns", "4",
		"--preamble-first-tokens", "33", "--preamble-user-tokens", "22", "--preamble-assistant-tokens", "44", "--preamble-stagger=false",
		"--agent-active", "13", "--agent-turns", "5", "--agent-system-tokens", "600", "--agent-task-tokens", "70",
		"--agent-call-tokens", "30", "--agent-min-result-tokens", "10", "--agent-max-result-tokens", "90", "--agent-stagger=false"})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Kind = KindAgent
	want.SysPrompt = SysPromptConfig{Prompts: 9, MinChars: 100, MaxChars: 900, QuestionTokens: 7, Zipf: 0.5}
	want.Preamble = PreambleConfig{Chars: 20000, Active: 11, Turns: 4, FirstUserTokens: 33, UserTokens: 22, AssistantTokens: 44}
	want.Agent = AgentConfig{Active: 13, Turns: 5, SystemTokens: 600, TaskTokens: 70, CallTokens: 30, MinResultTokens: 10, MaxResultTokens: 90}
	if c.Kind != want.Kind || c.SysPrompt != want.SysPrompt || c.Preamble != want.Preamble || c.Agent != want.Agent {
		t.Fatalf("flags not applied:\n got %+v %+v %+v\nwant %+v %+v %+v", c.SysPrompt, c.Preamble, c.Agent, want.SysPrompt, want.Preamble, want.Agent)
	}
	for _, k := range []Kind{KindSysPrompt, KindPreamble, KindAgent} {
		if err := (&kindFlag{new(Kind)}).Set(string(k)); err != nil {
			t.Errorf("--workload %s: %v", k, err)
		}
	}
}
