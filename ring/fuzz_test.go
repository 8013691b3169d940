package ring

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// refKey computes the routing key of a chat or completions body with
// encoding/json, as the documentation of Extract describes it. ok is false
// when the body is not of a shape the reference understands.
func refKey(cfg KeyConfig, api API, body, tenant []byte) (uint64, bool) {
	// encoding/json matches struct fields case-insensitively; engines do
	// not, so decode into maps with exact keys.
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return 0, false
	}
	var req struct {
		Model, PCK       *string
		Messages, Prompt json.RawMessage
	}
	for k, v := range top {
		switch k {
		case "model":
			if json.Unmarshal(v, &req.Model) != nil {
				return 0, false
			}
		case "prompt_cache_key":
			if json.Unmarshal(v, &req.PCK) != nil {
				return 0, false
			}
		case "messages":
			req.Messages = v
		case "prompt":
			req.Prompt = v
		}
	}
	var text strings.Builder
	switch api {
	case Chat:
		tools, hasTools := top["tools"]
		if f, ok := top["functions"]; ok {
			if hasTools {
				return 0, false // which came last is lost in the map
			}
			tools, hasTools = f, true
		}
		if hasTools {
			var list []json.RawMessage
			if json.Unmarshal(tools, &list) != nil {
				return 0, false
			}
			if len(list) > 0 {
				var c bytes.Buffer
				if json.Compact(&c, tools) != nil {
					return 0, false
				}
				text.WriteString("\x00tools\n" + c.String() + "\n")
			}
		}
		var raw []map[string]json.RawMessage
		if json.Unmarshal(req.Messages, &raw) != nil || len(raw) == 0 {
			return 0, false
		}
		type msg struct {
			Role    *string
			Content json.RawMessage
		}
		msgs := make([]msg, len(raw))
		for i, m := range raw {
			if r, ok := m["role"]; ok && json.Unmarshal(r, &msgs[i].Role) != nil {
				return 0, false
			}
			msgs[i].Content = m["content"]
		}
		for _, m := range msgs {
			if m.Role == nil {
				return 0, false
			}
			text.WriteString(*m.Role + "\n")
			var s string
			var parts []map[string]any
			switch {
			case len(m.Content) == 0 || string(m.Content) == "null":
			case json.Unmarshal(m.Content, &s) == nil:
				text.WriteString(s)
			case json.Unmarshal(m.Content, &parts) == nil:
				var rawParts []map[string]json.RawMessage
				var partBytes []json.RawMessage
				if json.Unmarshal(m.Content, &rawParts) != nil || json.Unmarshal(m.Content, &partBytes) != nil {
					return 0, false
				}
				n := 0
				for i, p := range parts {
					typ, ok := p["type"].(string)
					if !ok {
						return 0, false
					}
					if typ != "text" && typ != "input_text" && typ != "output_text" {
						// Escaped keys or types are matched raw by
						// Extract; leave them out.
						if bytes.IndexByte(partBytes[i], '\\') >= 0 {
							return 0, false
						}
						payload, ok := rawParts[i][typ]
						if !ok {
							payload = partBytes[i] // the whole part
						}
						var c bytes.Buffer
						if json.Compact(&c, payload) != nil {
							return 0, false
						}
						if n > 0 {
							text.WriteString("\n")
						}
						n++
						text.WriteString("\x00" + typ + "\n" + c.String())
						continue
					}
					t, ok := p["text"].(string)
					if !ok {
						return 0, false
					}
					if n > 0 {
						text.WriteString("\n")
					}
					n++
					text.WriteString(t)
				}
			default:
				return 0, false
			}
			text.WriteString("\n")
		}
	case Completions:
		var s string
		var ss []string
		var ids []uint32
		var nested [][]uint32
		switch {
		case json.Unmarshal(req.Prompt, &s) == nil:
			text.WriteString(s)
		case json.Unmarshal(req.Prompt, &ss) == nil && len(ss) > 0:
			text.WriteString(ss[0])
		case json.Unmarshal(req.Prompt, &ids) == nil:
			for _, id := range ids {
				text.WriteString(strconv.FormatUint(uint64(id), 10) + " ")
			}
		case json.Unmarshal(req.Prompt, &nested) == nil && len(nested) > 0:
			for _, id := range nested[0] {
				text.WriteString(strconv.FormatUint(uint64(id), 10) + " ")
			}
		default:
			return 0, false
		}
	default:
		return 0, false
	}
	t := text.String()
	if len(t) > cfg.PrefixLength {
		cut := cfg.PrefixLength
		for cut > 0 && !utf8.RuneStart(t[cut]) {
			cut--
		}
		t = t[:cut]
	}
	model, ten := "", ""
	if req.Model != nil {
		model = *req.Model
	}
	if req.PCK != nil {
		ten = *req.PCK
	}
	if tenant != nil {
		ten = string(tenant)
	}
	var sum [24]byte
	binary.LittleEndian.PutUint64(sum[0:], xxhash.Sum64String(model))
	binary.LittleEndian.PutUint64(sum[8:], xxhash.Sum64String(ten))
	binary.LittleEndian.PutUint64(sum[16:], xxhash.Sum64String(t))
	return xxhash.Sum64(sum[:]), true
}

func FuzzExtract(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"a\u00e9b"},{"type":"image_url","image_url":{"url":"u"}}]},{"role":"assistant","content":null}],"stream":true}`,
		`{"prompt":"hello","prompt_cache_key":"t1","temperature":0.5}`,
		`{"prompt":[1,2,3]}`,
		`{"prompt":[[4,5],[6]]}`,
		`{"prompt":["a","b"]}`,
		`{"inputs":"x","parameters":{}}`,
		`{"messages":"bad"}`,
		`[`, `{"a":"\ud83d\ude00"}`, `{"n":-0.5e+10}`, "",
	}
	for _, s := range seeds {
		for api := range numAPIs {
			f.Add(uint8(api), false, 1024, []byte(s), "")
			f.Add(uint8(api), true, 4096, []byte(s), "tenant")
		}
	}
	for _, s := range []string{
		`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},{"type":"text","text":"x"}]}],"functions":[{"name":"g"}]}`,
		`{"model":"m","input":["a","b"]}`,
		`{"model":"m","instructions":"be brief","tools":[{"type":"function","name":"f"}],"input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"http://x"}]},{"type":"function_call_output","call_id":"c","output":"42"}]}`,
		`{"model":"m","query":"q","documents":["a","b"]}`,
		`{"model":"m","text_1":"a","text_2":["b","c"]}`,
		`{"model":"m","tokens":[1,2,3]}`,
	} {
		for api := range numAPIs {
			f.Add(uint8(api), false, 1024, []byte(s), "")
		}
	}
	f.Fuzz(func(t *testing.T, api uint8, invJSON bool, plen int, body []byte, tenant string) {
		cfg := KeyConfig{PrefixLength: MinPrefixLength + int(uint(plen)%uint(MaxPrefixLength-MinPrefixLength+1)), InvocationsJSON: invJSON}
		a := API(api % uint8(numAPIs))
		var th []byte
		if tenant != "" {
			th = []byte(tenant)
		}
		var i1, i2 KeyInfo
		err1 := Extract(cfg, a, body, th, &i1)
		err2 := Extract(cfg, a, body, th, &i2)
		if (err1 == nil) != (err2 == nil) || i1.Key != i2.Key || i1.PrefixBytes != i2.PrefixBytes || !bytes.Equal(i1.Model, i2.Model) || !bytes.Equal(i1.Tenant, i2.Tenant) {
			t.Fatalf("not deterministic: %v/%v %+v/%+v", err1, err2, i1, i2)
		}
		if err1 != nil {
			if !errors.Is(err1, ErrMalformedJSON) && !errors.Is(err1, ErrInvalidRequest) && !errors.Is(err1, ErrTooDeep) && !errors.Is(err1, ErrBadTenant) {
				t.Fatalf("unclassified error %v", err1)
			}
			if errors.Is(err1, ErrMalformedJSON) && json.Valid(body) {
				t.Fatalf("valid JSON rejected as malformed: %v: %q", err1, body)
			}
			return
		}
		if i1.PrefixBytes > cfg.PrefixLength {
			t.Fatalf("hashed %d bytes, limit %d", i1.PrefixBytes, cfg.PrefixLength)
		}
		if !json.Valid(body) || !utf8.Valid(body) || !utf8.ValidString(tenant) {
			return
		}
		if a == Invocations {
			checkChain(t, cfg, a, body, th, plen)
			return
		}
		want, ok := refKey(cfg, a, body, th)
		if ok && want != i1.Key {
			t.Fatalf("key %x, reference %x for %q", i1.Key, want, body)
		}
		checkChain(t, cfg, a, body, th, plen)
	})
}

// checkChain checks the block chain of a body Extract accepts: it is read
// without error, within its limit, and a shorter read is a prefix of a
// longer one (the same blocks, the same keys).
func checkChain(t *testing.T, cfg KeyConfig, a API, body, th []byte, n int) {
	short, long := cfg, cfg
	short.ChainBlocks = 1 + int(uint(n)%8)
	long.ChainBlocks = short.ChainBlocks + 1 + int(uint(n>>3)%8)
	var s, l KeyInfo
	if err := Extract(short, a, body, th, &s); err != nil {
		t.Fatalf("chain of %d blocks: %v", short.ChainBlocks, err)
	}
	if err := Extract(long, a, body, th, &l); err != nil {
		t.Fatalf("chain of %d blocks: %v", long.ChainBlocks, err)
	}
	if s.Blocks > short.ChainBlocks || s.PrefixBytes > short.ChainBlocks*ChainBlockBytes || s.Blocks != s.PrefixBytes/ChainBlockBytes {
		t.Fatalf("read %d blocks, %d bytes, limit %d blocks", s.Blocks, s.PrefixBytes, short.ChainBlocks)
	}
	if l.Blocks < s.Blocks || l.PrefixBytes < s.PrefixBytes {
		t.Fatalf("a longer read has less: %d/%d blocks, %d/%d bytes", l.Blocks, s.Blocks, l.PrefixBytes, s.PrefixBytes)
	}
	for d := 0; d < s.Blocks; d++ {
		if s.Chain[d] != l.Chain[d] || s.KeyAt(d) != l.KeyAt(d) {
			t.Fatalf("block %d differs between reads of %d and %d blocks", d, short.ChainBlocks, long.ChainBlocks)
		}
	}
	if s.PrefixBytes < short.ChainBlocks*ChainBlockBytes && (s.Tail != l.Tail || s.KeyAt(s.Blocks) != l.KeyAt(l.Blocks)) {
		t.Fatalf("the whole text (%d bytes) read twice gives two tails", s.PrefixBytes)
	}
}

func FuzzCheckTenant(f *testing.F) {
	for _, s := range []string{"a", "tenant-1", "", strings.Repeat("x", 65), "tab\t", "é"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		err := CheckTenant(v)
		ok := len(v) >= 1 && len(v) <= 64
		for _, c := range v {
			if c < 0x20 || c > 0x7e {
				ok = false
			}
		}
		if ok != (err == nil) {
			t.Fatalf("CheckTenant(%q) = %v, want ok=%v", v, err, ok)
		}
		if err != nil && !errors.Is(err, ErrBadTenant) {
			t.Fatalf("error %v does not wrap ErrBadTenant", err)
		}
	})
}

// rejected reports whether parse refused s, failing t unless the error
// wraps ErrConfig.
func rejected(t *testing.T, parse, s string, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, ErrConfig) {
		t.Fatalf("%s(%q): %v does not wrap ErrConfig", parse, s, err)
	}
	return err != nil
}

// FuzzParseStrategy: strategy names from flags, YAML, the admin API and
// SageMaker's RoutingConfig never panic the parser; an accepted name is a
// known strategy whose canonical name (and its text form) parses back to
// it, whatever the case and '-' for '_'.
func FuzzParseStrategy(f *testing.F) {
	for _, s := range []string{"PREFIX_AWARE", "prefix-aware", " Round_Robin ", "LOR", "least-outstanding",
		"LEAST_OUTSTANDING_REQUESTS", "consistent_hash", "RANDOM", "", "NOPE", "PREFIX AWARE", "prefixaware", "ſ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		st, err := ParseStrategy(s)
		if rejected(t, "ParseStrategy", s, err) {
			return
		}
		if _, ok := st.Info(); !ok {
			t.Fatalf("ParseStrategy(%q) = unknown %d", s, st)
		}
		for _, form := range []string{st.String(), strings.ToLower(st.String()), strings.ReplaceAll(st.String(), "_", "-")} {
			if back, err := ParseStrategy(form); err != nil || back != st {
				t.Fatalf("ParseStrategy(%q) = %v; %q parses to %v, %v", s, st, form, back, err)
			}
		}
		text, _ := st.MarshalText()
		var u Strategy
		if err := u.UnmarshalText(text); err != nil || u != st {
			t.Fatalf("%v: text %q unmarshals to %v, %v", st, text, u, err)
		}
		if lower, err := ParseStrategy(strings.ToLower(s)); err != nil || lower != st {
			t.Fatalf("ParseStrategy(%q) = %v, but in lower case %v, %v", s, st, lower, err)
		}
	})
}

// FuzzParseState: backend states from the admin API and cluster commands
// never panic the parser; an accepted state is one of the three and its
// name parses back to it.
func FuzzParseState(f *testing.F) {
	for _, s := range []string{"active", "draining", "drain", "down", "", " DOWN ", "up", "Draining\n", "K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		st, err := ParseState(s)
		if rejected(t, "ParseState", s, err) {
			return
		}
		if st != Active && st != Draining && st != Down {
			t.Fatalf("ParseState(%q) = unknown %d", s, st)
		}
		if back, err := ParseState(st.String()); err != nil || back != st {
			t.Fatalf("ParseState(%q) = %v; its name parses to %v, %v", s, st, back, err)
		}
	})
}
