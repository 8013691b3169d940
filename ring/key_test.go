package ring

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func mustKey(t *testing.T, api API, body string, tenant []byte) KeyInfo {
	t.Helper()
	var info KeyInfo
	if err := Extract(KeyConfig{PrefixLength: 4096}, api, []byte(body), tenant, &info); err != nil {
		t.Fatalf("Extract(%s): %v", body, err)
	}
	return info
}

func TestChatKeyIgnoresFormattingAndSampling(t *testing.T) {
	base := `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi there"}]}`
	variants := []string{
		// whitespace and key order
		"{\n  \"messages\": [ {\"content\": \"You are helpful.\", \"role\": \"system\"},\n {\"role\":\"user\",\"content\":\"Hi there\"} ],\n  \"model\" : \"m\"\n}",
		// sampling fields
		`{"model":"m","temperature":0.7,"top_p":0.9,"stream":true,"max_tokens":12,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi there"}]}`,
		// escapes that decode to the same text
		`{"model":"m","messages":[{"role":"system","content":"You are helpful\u002e"},{"role":"user","content":"Hi\u0020there"}]}`,
		// content as an array of text parts, one part
		`{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"You are helpful."}]},{"role":"user","content":[{"text":"Hi there","type":"text"}]}]}`,
		// no tools, in either form
		`{"model":"m","tools":[],"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi there"}],"functions":null}`,
		// extra message fields
		`{"model":"m","messages":[{"role":"system","name":"x","content":"You are helpful."},{"role":"user","content":"Hi there"}],"user":"u1"}`,
	}
	want := mustKey(t, Chat, base, nil)
	for i, v := range variants {
		if got := mustKey(t, Chat, v, nil); got.Key != want.Key {
			t.Errorf("variant %d: key %x, want %x", i, got.Key, want.Key)
		}
	}
	if got := mustKey(t, Chat, variants[1], nil); !got.Stream {
		t.Error("stream flag not read")
	}
	if string(want.Model) != "m" {
		t.Errorf("model = %q", want.Model)
	}
}

func TestChatKeyDistinguishes(t *testing.T) {
	base := mustKey(t, Chat, `{"model":"m","messages":[{"role":"user","content":"Hi there"}]}`, nil)
	others := []string{
		`{"model":"m2","messages":[{"role":"user","content":"Hi there"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"Hi there"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"Hi therE"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"Hi"},{"role":"user","content":"there"}]}`,
		// what the engine caches beyond the text: images, audio, tools
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hi there"},{"type":"image_url","image_url":{"url":"http://x/1.png"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/1.png"}},{"type":"text","text":"Hi there"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hi there"},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`,
		`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"Hi there"}]}`,
	}
	for i, o := range others {
		if got := mustKey(t, Chat, o, nil); got.Key == base.Key {
			t.Errorf("other %d shares the key", i)
		}
	}
}

func TestSharedPrefixDifferentSuffixSameKey(t *testing.T) {
	doc := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200) // 9000 bytes
	a := mustKey(t, Chat, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, doc+"Question one?"), nil)
	b := mustKey(t, Chat, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q},{"role":"user","content":"more"}]}`, doc+"Another question entirely"), nil)
	if a.Key != b.Key {
		t.Fatal("same 4 KiB prefix, different suffix: keys differ")
	}
	if a.PrefixBytes != 4096 {
		t.Errorf("PrefixBytes = %d, want 4096", a.PrefixBytes)
	}
	// Below the prefix length the suffix matters.
	c := mustKey(t, Chat, `{"model":"m","messages":[{"role":"user","content":"short doc. Q1"}]}`, nil)
	d := mustKey(t, Chat, `{"model":"m","messages":[{"role":"user","content":"short doc. Q2"}]}`, nil)
	if c.Key == d.Key {
		t.Fatal("short prompts that differ share a key")
	}
}

func TestTenantsNeverShareKeys(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"identical prompt"}]}`
	none := mustKey(t, Chat, body, nil)
	a := mustKey(t, Chat, body, []byte("tenant-a"))
	b := mustKey(t, Chat, body, []byte("tenant-b"))
	if a.Key == b.Key || a.Key == none.Key || b.Key == none.Key {
		t.Fatalf("tenant keys collide: none=%x a=%x b=%x", none.Key, a.Key, b.Key)
	}
	// prompt_cache_key is the same tenant as the header of the same value.
	pck := mustKey(t, Chat, `{"model":"m","prompt_cache_key":"tenant-a","messages":[{"role":"user","content":"identical prompt"}]}`, nil)
	if pck.Key != a.Key || pck.TenantFromHeader || string(pck.Tenant) != "tenant-a" {
		t.Fatalf("prompt_cache_key tenant: %+v vs header %x", pck, a.Key)
	}
	// The header wins over the body.
	both := mustKey(t, Chat, `{"model":"m","prompt_cache_key":"tenant-b","messages":[{"role":"user","content":"identical prompt"}]}`, []byte("tenant-a"))
	if both.Key != a.Key {
		t.Fatal("header did not take precedence over prompt_cache_key")
	}
}

func TestTenantHeaderValidation(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	for _, bad := range [][]byte{{}, []byte(strings.Repeat("a", 65)), []byte("tab\there"), []byte("nul\x00"), []byte("caf\xc3\xa9")} {
		var info KeyInfo
		if err := Extract(KeyConfig{PrefixLength: 4096}, Chat, body, bad, &info); !errors.Is(err, ErrBadTenant) {
			t.Errorf("tenant %q: err = %v, want ErrBadTenant", bad, err)
		}
	}
	for _, good := range []string{"a", strings.Repeat("z", 64), "tenant 42/x:y"} {
		if err := CheckTenant([]byte(good)); err != nil {
			t.Errorf("tenant %q: %v", good, err)
		}
	}
}

func TestCompletionsPrompt(t *testing.T) {
	s := mustKey(t, Completions, `{"model":"m","prompt":"hello world"}`, nil)
	arr := mustKey(t, Completions, `{"model":"m","prompt":["hello world","ignored"]}`, nil)
	if s.Key != arr.Key {
		t.Error("first string of a prompt array should match the plain string")
	}
	toks := mustKey(t, Completions, `{"model":"m","prompt":[1,2,30]}`, nil)
	nested := mustKey(t, Completions, `{"model":"m","prompt":[[1,2,30],[4]]}`, nil)
	text := mustKey(t, Completions, `{"model":"m","prompt":"1 2 30 "}`, nil)
	if toks.Key != nested.Key || toks.Key != text.Key {
		t.Error("token ids should hash as their decimal text")
	}
}

func TestInvocations(t *testing.T) {
	raw := KeyConfig{PrefixLength: 1024}
	js := KeyConfig{PrefixLength: 1024, InvocationsJSON: true}
	a := []byte(`{"inputs":"hello","parameters":{"max_new_tokens":5}}`)
	b := []byte(`{"parameters":{"max_new_tokens":5},"inputs":"hello"}`)
	var ia, ib KeyInfo
	if err := Extract(raw, Invocations, a, nil, &ia); err != nil {
		t.Fatal(err)
	}
	if err := Extract(raw, Invocations, b, nil, &ib); err != nil {
		t.Fatal(err)
	}
	if ia.Key == ib.Key {
		t.Error("raw mode should hash raw bytes (SageMaker semantics)")
	}
	if err := Extract(raw, Invocations, []byte("not json at all"), nil, &ia); err != nil {
		t.Errorf("raw mode must accept any body: %v", err)
	}
	if err := Extract(js, Invocations, a, nil, &ia); err != nil {
		t.Fatal(err)
	}
	if err := Extract(js, Invocations, b, nil, &ib); err != nil {
		t.Fatal(err)
	}
	if ia.Key != ib.Key {
		t.Error("JSON mode should ignore key order")
	}
	chat := mustKey(t, Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	var inv KeyInfo
	if err := Extract(KeyConfig{PrefixLength: 4096, InvocationsJSON: true}, Invocations, []byte(`{"messages":[{"role":"user","content":"hi"}],"model":"m"}`), nil, &inv); err != nil {
		t.Fatal(err)
	}
	if inv.Key != chat.Key {
		t.Error("invocations JSON with messages should key like chat")
	}
}

func TestPrefixCutAtUTF8Boundary(t *testing.T) {
	// 1023 ASCII bytes then a 3-byte rune straddling the 1024 limit.
	text := strings.Repeat("a", 1023) + "€" + "tail"
	cfg := KeyConfig{PrefixLength: 1024}
	var a, b KeyInfo
	if err := Extract(cfg, Completions, []byte(fmt.Sprintf(`{"prompt":%q}`, text)), nil, &a); err != nil {
		t.Fatal(err)
	}
	if a.PrefixBytes != 1023 {
		t.Fatalf("PrefixBytes = %d, want 1023 (cut before the rune)", a.PrefixBytes)
	}
	// Same prefix but the rune escaped: same cut, same key.
	if err := Extract(cfg, Completions, []byte(`{"prompt":"`+strings.Repeat("a", 1023)+`\u20acother"}`), nil, &b); err != nil {
		t.Fatal(err)
	}
	if a.Key != b.Key || b.PrefixBytes != 1023 {
		t.Fatalf("escaped rune at the boundary: key %x/%x, bytes %d", a.Key, b.Key, b.PrefixBytes)
	}
}

func TestSurrogatePairs(t *testing.T) {
	a := mustKey(t, Completions, `{"prompt":"😀 smile"}`, nil)
	b := mustKey(t, Completions, `{"prompt":"\ud83d\ude00 smile"}`, nil)
	if a.Key != b.Key {
		t.Fatal("surrogate pair escape should decode to the same rune")
	}
}

func TestExtractErrors(t *testing.T) {
	deep := strings.Repeat("[", 300) + strings.Repeat("]", 300)
	cases := []struct {
		api  API
		body string
		want error
	}{
		{Chat, ``, ErrMalformedJSON},
		{Chat, `{`, ErrMalformedJSON},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}]`, ErrMalformedJSON},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}]} trailing`, ErrMalformedJSON},
		{Chat, `{"model":"m",}`, ErrMalformedJSON},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x\q"}]}`, ErrMalformedJSON},
		{Chat, `{"model":"m","n":01}`, ErrMalformedJSON},
		{Chat, `{"model":"m","n":1.}`, ErrMalformedJSON},
		{Chat, `{"model":"m","n":tru}`, ErrMalformedJSON},
		{Chat, `{"model":"m","messages":"hi"}`, ErrInvalidRequest},
		{Chat, `{"model":"m","messages":[]}`, ErrInvalidRequest},
		{Chat, `{"model":"m","messages":[{"role":"user","content":{"a":1}}]}`, ErrInvalidRequest},
		{Chat, `{"model":"m","messages":[{"content":"x"}]}`, ErrInvalidRequest},
		{Chat, `{"model":"m","messages":["x"]}`, ErrInvalidRequest},
		{Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, ErrInvalidRequest},
		{Chat, `{"model":5,"messages":[{"role":"user","content":"x"}]}`, ErrInvalidRequest},
		{Chat, `{"model":"m"}`, ErrInvalidRequest},
		{Chat, `[1,2]`, ErrInvalidRequest},
		{Chat, `{"prompt_cache_key":7,"messages":[{"role":"user","content":"x"}]}`, ErrInvalidRequest},
		{Completions, `{"model":"m"}`, ErrInvalidRequest},
		{Completions, `{"prompt":{"a":1}}`, ErrInvalidRequest},
		{Completions, `{"prompt":[1,"a"]}`, ErrInvalidRequest},
		{Completions, `{"prompt":[1.5]}`, ErrInvalidRequest},
		{Completions, `{"prompt":[-1]}`, ErrInvalidRequest},
		{Chat, `{"tools":` + deep + `,"messages":[{"role":"user","content":"x"}]}`, ErrTooDeep},
	}
	for _, c := range cases {
		var info KeyInfo
		err := Extract(KeyConfig{PrefixLength: 4096}, c.api, []byte(c.body), nil, &info)
		if !errors.Is(err, c.want) {
			t.Errorf("%s %.60q: err = %v, want %v", c.api, c.body, err, c.want)
		}
	}
}

func TestExtractAllocations(t *testing.T) {
	body := []byte(fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-70B-Instruct","stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":[{"type":"text","text":"What does it say?"}]}],"temperature":0.2}`, strings.Repeat("policy text é ", 400)))
	tenant := []byte("tenant-1")
	var info KeyInfo
	cfg := KeyConfig{PrefixLength: 4096}
	allocs := testing.AllocsPerRun(200, func() {
		if err := Extract(cfg, Chat, body, tenant, &info); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Extract allocates %.1f times per call, want 0", allocs)
	}
}

// TestEndpointKeys: each endpoint keys on the text its engine caches, so
// the same text gives the same key across endpoints (under one model),
// and a missing or mistyped prompt field is refused.
func TestEndpointKeys(t *testing.T) {
	chat := mustKey(t, Chat, `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi there"}]}`, nil).Key
	prompt := mustKey(t, Completions, `{"model":"m","prompt":"Hi there"}`, nil).Key
	ids := mustKey(t, Completions, `{"model":"m","prompt":[1,2,3]}`, nil).Key
	same := []struct {
		api  API
		body string
		want uint64
	}{
		{Embeddings, `{"model":"m","input":"Hi there"}`, prompt},
		{Embeddings, `{"model":"m","input":["Hi there","more"],"encoding_format":"float"}`, prompt},
		{Embeddings, `{"model":"m","input":[1,2,3]}`, ids},
		{Score, `{"model":"m","text_1":"Hi there","text_2":["a","b"]}`, prompt},
		{Rerank, `{"model":"m","query":"Hi there","documents":["a","b"]}`, prompt},
		{Detokenize, `{"model":"m","tokens":[1,2,3]}`, ids},
		{Tokenize, `{"model":"m","prompt":"Hi there"}`, prompt},
		{Tokenize, `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi there"}],"add_generation_prompt":true}`, chat},
		{Responses, `{"model":"m","instructions":"You are helpful.","input":"Hi there"}`, chat},
		{Responses, `{"model":"m","instructions":"You are helpful.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi there"}]}]}`, chat},
		{Responses, `{"model":"m","input":[{"role":"system","content":"You are helpful."},{"type":"message","role":"user","content":"Hi there"}],"store":false}`, chat},
	}
	for i, c := range same {
		if got := mustKey(t, c.api, c.body, nil).Key; got != c.want {
			t.Errorf("%d (%s): key %x, want %x", i, c.api, got, c.want)
		}
	}
	// Tools lead the text wherever they sit in the body, in chat and
	// responses alike.
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	before := mustKey(t, Chat, `{"model":"m","tools":`+tools+`,"messages":[{"role":"user","content":"Hi there"}]}`, nil).Key
	after := mustKey(t, Chat, `{"model":"m","messages":[{"role":"user","content":"Hi there"}],"tools":`+strings.ReplaceAll(tools, ",", ", ")+`}`, nil).Key
	if before != after {
		t.Errorf("tools before and after the messages: %x, %x", before, after)
	}
	if before == mustKey(t, Chat, `{"model":"m","messages":[{"role":"user","content":"Hi there"}]}`, nil).Key {
		t.Error("tools do not enter the key")
	}
	resp := mustKey(t, Responses, `{"model":"m","input":"Hi there","tools":`+tools+`}`, nil).Key
	if resp != before {
		t.Errorf("responses with tools %x, chat with tools %x", resp, before)
	}
	// A function call's output is part of the conversation.
	a := mustKey(t, Responses, `{"model":"m","input":[{"role":"user","content":"Hi"},{"type":"function_call_output","call_id":"c1","output":"20C"}]}`, nil).Key
	b := mustKey(t, Responses, `{"model":"m","input":[{"role":"user","content":"Hi"},{"type":"function_call_output","call_id":"c1","output":"25C"}]}`, nil).Key
	if a == b {
		t.Error("function call outputs do not enter the key")
	}

	bad := []struct {
		api  API
		body string
	}{
		{Embeddings, `{"model":"m"}`},
		{Embeddings, `{"model":"m","input":{"x":1}}`},
		{Score, `{"model":"m","text_2":"a"}`},
		{Rerank, `{"model":"m","documents":["a"]}`},
		{Rerank, `{"model":"m","query":["a"]}`},
		{Detokenize, `{"model":"m","tokens":"1 2"}`},
		{Detokenize, `{"model":"m","tokens":[-1]}`},
		{Tokenize, `{"model":"m"}`},
		{Responses, `{"model":"m","instructions":"x"}`},
		{Responses, `{"model":"m","input":42}`},
		{Responses, `{"model":"m","input":[1]}`},
		{Responses, `{"model":"m","input":"x","instructions":7}`},
		{Chat, `{"model":"m","tools":{"a":1},"messages":[{"role":"user","content":"x"}]}`},
		{Chat, `{"model":"m","messages":[{"role":"user","content":[{"image_url":{"url":"u"}}]}]}`},
	}
	for i, c := range bad {
		var info KeyInfo
		if err := Extract(KeyConfig{PrefixLength: 4096}, c.api, []byte(c.body), nil, &info); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("bad %d (%s %s): %v, want ErrInvalidRequest", i, c.api, c.body, err)
		}
	}
}

// TestSessionKeys: a session id keys a request under its model and tenant
// whatever its prompt, with fixed keys and with the block chain alike.
func TestSessionKeys(t *testing.T) {
	for _, cfg := range []KeyConfig{{PrefixLength: 4096}, {ChainBlocks: 5}} {
		key := func(body, tenant, session string) KeyInfo {
			t.Helper()
			var info KeyInfo
			var th []byte
			if tenant != "" {
				th = []byte(tenant)
			}
			if err := Extract(cfg, Chat, []byte(body), th, &info); err != nil {
				t.Fatal(err)
			}
			if session != "" {
				if err := CheckSession([]byte(session)); err != nil {
					t.Fatal(err)
				}
				info.UseSession([]byte(session))
			}
			return info
		}
		a := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("first turn ", 300) + `"}]}`
		b := `{"model":"m","messages":[{"role":"system","content":"another system prompt"},{"role":"user","content":"x"}]}`
		s1 := key(a, "", "sess-1")
		if s1.Key != key(b, "", "sess-1").Key || !s1.Session || s1.PrefixBytes != 0 || s1.Blocks != 0 {
			t.Fatalf("chain %d: one session, two prompts: %+v", cfg.ChainBlocks, s1)
		}
		if s1.Key == key(a, "", "sess-2").Key || s1.Key == key(a, "", "").Key {
			t.Fatalf("chain %d: sessions or prompt share a key", cfg.ChainBlocks)
		}
		if s1.Key == key(a, "tenant-b", "sess-1").Key || s1.Key == key(strings.Replace(a, `"m"`, `"m2"`, 1), "", "sess-1").Key {
			t.Fatalf("chain %d: the session key ignores the tenant or the model", cfg.ChainBlocks)
		}
		if cfg.ChainBlocks > 0 && s1.KeyAt(0) != s1.Key {
			t.Fatal("KeyAt(0) of a session differs from its key")
		}
	}
	for _, bad := range []string{"", strings.Repeat("s", MaxSessionLength+1), "tab\tid", "é"} {
		if err := CheckSession([]byte(bad)); !errors.Is(err, ErrBadSession) {
			t.Errorf("CheckSession(%q) = %v", bad, err)
		}
	}
	var h HeaderName
	for _, ok := range []string{"", "X-Session-Id", " x-amzn-sagemaker-session-id "} {
		if err := h.UnmarshalText([]byte(ok)); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if h != "x-amzn-sagemaker-session-id" {
		t.Errorf("blanks kept: %q", h)
	}
	for _, bad := range []string{"X Session", "X-Session:", "X-Sé", strings.Repeat("x", 65)} {
		if err := h.UnmarshalText([]byte(bad)); !errors.Is(err, ErrConfig) {
			t.Errorf("header name %q: %v", bad, err)
		}
	}
	s := DefaultSettings()
	s.SessionHeader = "bad name"
	if err := s.Validate(); err == nil {
		t.Error("Validate accepts a bad session header name")
	}
}
