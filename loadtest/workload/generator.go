package workload

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// Request is one prepared API call.
type Request struct {
	// Seq is the request's position in the sequence, from 0.
	Seq  int
	Kind Kind
	// Path is PathChat or PathCompletions.
	Path string
	// Body is the JSON body. Next overwrites it, reusing its storage.
	Body []byte
	// Tenant is the body's prompt_cache_key ("" when tenants are off).
	Tenant string
	// Group names the set of requests that share a long prefix with this
	// one: a document, a conversation, a template or a file. It is empty
	// for requests that share nothing.
	Group string
}

// Generator yields a deterministic sequence of requests.
type Generator interface {
	// Next renders the next request into r, reusing r.Body's storage.
	// It is not safe for concurrent use.
	Next(r *Request)
}

// source produces the requests of one kind; tenant and sequence number are
// filled by the generator.
type source interface {
	next(r *Request)
}

type generator struct {
	cfg     Config
	rng     *rand.Rand
	seq     int
	tenants []string
	sources []source
	kinds   []Kind
	cum     []float64 // cumulative mix weights, normalised
}

var _ Generator = (*generator)(nil)

// New returns the generator for c.
func New(c Config) (Generator, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	g := &generator{cfg: c, rng: subRand(c.Seed, "main", 0)}
	for i := 0; i < c.Tenants; i++ {
		g.tenants = append(g.tenants, fmt.Sprintf("tenant-%02d", i))
	}
	if c.Kind != KindMix {
		g.kinds = []Kind{c.Kind}
		g.sources = []source{newSource(&g.cfg, c.Kind)}
		g.cum = []float64{1}
		return g, nil
	}
	total := 0.0
	for _, w := range c.Mix {
		total += w.Weight
	}
	acc := 0.0
	for _, w := range c.Mix {
		if w.Weight == 0 {
			continue
		}
		acc += w.Weight / total
		g.kinds = append(g.kinds, w.Kind)
		g.sources = append(g.sources, newSource(&g.cfg, w.Kind))
		g.cum = append(g.cum, acc)
	}
	g.cum[len(g.cum)-1] = 1
	return g, nil
}

func newSource(c *Config, k Kind) source {
	r := subRand(c.Seed, "source-"+string(k), 0)
	switch k {
	case KindRAG:
		return newRAG(c, r)
	case KindChat:
		return newChat(c, r)
	case KindBot:
		return newBot(c, r)
	case KindCode:
		return newCode(c, r)
	case KindSysPrompt:
		return newSysPrompt(c, r)
	case KindPreamble:
		return newPreamble(c, r)
	case KindAgent:
		return newAgent(c, r)
	default:
		return newNoReuse(c, r)
	}
}

func (g *generator) Next(r *Request) {
	i := 0
	if len(g.sources) > 1 {
		u := g.rng.Float64()
		for i < len(g.cum)-1 && g.cum[i] <= u {
			i++
		}
	}
	r.Seq = g.seq
	g.seq++
	r.Kind = g.kinds[i]
	r.Tenant = ""
	if len(g.tenants) > 0 {
		r.Tenant = g.tenants[g.rng.IntN(len(g.tenants))]
	}
	g.sources[i].next(r)
}

// message is a chat message whose content is the concatenation of parts.
type message struct {
	role  string
	parts []string
}

// setChat makes r the chat completion of msgs, in group.
func (r *Request) setChat(c *Config, group string, msgs []message) {
	r.Path = PathChat
	r.Group = group
	r.Body = appendChatBody(r.Body[:0], c, msgs, r.Tenant)
}

// appendChatBody renders a /v1/chat/completions body.
func appendChatBody(b []byte, c *Config, msgs []message, tenant string) []byte {
	b = appendModel(b, c)
	b = append(b, `"messages":[`...)
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":"`...)
		b = append(b, m.role...)
		b = append(b, `","content":"`...)
		for _, p := range m.parts {
			b = appendJSONEscaped(b, p)
		}
		b = append(b, `"}`...)
	}
	b = append(b, ']')
	return appendTail(b, c, tenant)
}

// appendCompletionBody renders a /v1/completions body.
func appendCompletionBody(b []byte, c *Config, parts []string, tenant string) []byte {
	b = appendModel(b, c)
	b = append(b, `"prompt":"`...)
	for _, p := range parts {
		b = appendJSONEscaped(b, p)
	}
	b = append(b, '"')
	return appendTail(b, c, tenant)
}

// appendModel opens the body with the model, if any.
func appendModel(b []byte, c *Config) []byte {
	b = append(b, '{')
	if c.Model != "" {
		b = append(b, `"model":`...)
		b = appendJSONString(b, c.Model)
		b = append(b, ',')
	}
	return b
}

func appendTail(b []byte, c *Config, tenant string) []byte {
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(c.MaxTokens), 10)
	if c.Stream {
		b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	if tenant != "" {
		b = append(b, `,"prompt_cache_key":`...)
		b = appendJSONString(b, tenant)
	}
	return append(b, '}')
}

// SharedTokens estimates the working set of c: the tokens of all distinct
// long prefixes a fleet would have to keep cached to serve every reuse
// (documents, open conversation histories, policy blocks, files, system
// prompts, the preamble, open agent sessions). The no-reuse control has
// none. For a mix it is the sum over its kinds. Lengths given in
// characters count 4 to a token, as the generated text does.
func (c Config) SharedTokens() int {
	kinds := []Kind{c.Kind}
	if c.Kind == KindMix {
		kinds = kinds[:0]
		for _, w := range c.Mix {
			if w.Weight > 0 {
				kinds = append(kinds, w.Kind)
			}
		}
	}
	total := 0
	for _, k := range kinds {
		switch k {
		case KindRAG:
			total += c.RAG.Documents * c.RAG.DocumentTokens
		case KindChat:
			h := c.Chat
			// a conversation's history grows linearly; on average it is
			// half way through its turns.
			avg := h.SystemTokens + h.FirstUserTokens + (h.Turns-1)*(h.UserTokens+h.AssistantTokens)/2
			total += h.Active * avg
		case KindBot:
			total += c.Bot.Templates * c.Bot.PolicyTokens
		case KindCode:
			total += c.Code.Files * c.Code.FileTokens
		case KindSysPrompt:
			// every prompt's length, as the generator draws it
			chars := 0
			for i := 0; i < c.SysPrompt.Prompts; i++ {
				_, n := sysPromptRand(&c, i)
				chars += n
			}
			total += (chars + 3) / 4
		case KindPreamble:
			p := c.Preamble
			avg := p.FirstUserTokens + (p.Turns-1)*(p.UserTokens+p.AssistantTokens)/2
			total += (p.Chars+3)/4 + p.Active*avg
		case KindAgent:
			a := c.Agent
			// a session is half way through its turns on average, and a
			// tool result is of average size
			perTurn := a.CallTokens + (a.MinResultTokens+a.MaxResultTokens)/2
			total += a.SystemTokens + a.Active*(a.TaskTokens+(a.Turns-1)*perTurn/2)
		}
	}
	return total
}
