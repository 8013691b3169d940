package proxy

import (
	"bytes"
	"encoding/json"
	"regexp"
	"testing"
)

// FuzzUsageScan: the usage scan never panics; what it reads does not
// depend on how the bytes are cut into reads, in either mode; a JSON line
// reads the same as a document and as an SSE event; its reports keep
// their bounds (0 <= cached <= prompt < 10^9); and on documents that
// encoding/json accepts (without escapes, repeated keys or deep nesting,
// which the scan treats its own way) it agrees with a reading through
// encoding/json.
func FuzzUsageScan(f *testing.F) {
	for _, tc := range usageJSONCases {
		f.Add([]byte(tc.doc), uint16(len(tc.doc)/3), uint16(len(tc.doc)/2))
	}
	for _, tc := range usageSSECases {
		f.Add([]byte(tc.stream), uint16(len(tc.stream)-20), uint16(len(tc.stream)-3))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut1, cut2 uint16) {
		i, j := int(cut1)%(len(data)+1), int(cut2)%(len(data)+1)
		if i > j {
			i, j = j, i
		}
		for _, mode := range []uint8{scanJSON, scanSSE} {
			whole := scanPieces(mode, data)
			checkUsageBounds(t, whole)
			if cut := scanPieces(mode, data[:i], data[i:j], data[j:]); cut != whole {
				t.Fatalf("mode %d: cut at %d and %d the scan reads %v, whole %v", mode, i, j, cut, whole)
			}
		}
		doc := scanPieces(scanJSON, data)
		if bytes.IndexByte(data, '\n') < 0 {
			event := append(append([]byte("data: "), data...), "\n\n"...)
			if got := scanPieces(scanSSE, event); got != doc {
				t.Fatalf("as an event the scan reads %v, as a document %v", got, doc)
			}
		}
		if want, ok := refUsage(data); ok && doc != want {
			t.Fatalf("the scan reads %v, encoding/json %v", doc, want)
		}
	})
}

func checkUsageBounds(t *testing.T, r usageReport) {
	t.Helper()
	switch r.result {
	case usageOK, usageNoDetails:
		if r.prompt < 0 || r.prompt >= 1e9 || r.cached < 0 || r.cached > r.prompt || (r.result == usageNoDetails && r.cached != 0) {
			t.Fatalf("report out of bounds: %+v", r)
		}
	case usageNone, usageInvalid:
		if r.prompt != 0 || r.cached != 0 {
			t.Fatalf("report %+v carries counts", r)
		}
	default:
		t.Fatalf("unknown result in %+v", r)
	}
}

var (
	plainCount  = regexp.MustCompile(`^(0|[1-9][0-9]{0,8})$`)
	responseKey = regexp.MustCompile(`"response"\s*:`)
)

// refUsage reads the top-level usage of doc's first JSON value (or that of
// its top-level "response" object) with encoding/json, by the scan's
// rules, under the Chat Completions' names or the Responses API's. ok is
// false when encoding/json does not accept the value or the scan knowingly
// differs: escapes (it does not decode keys), a key of the usage path
// written twice, under either name (it keeps a bad count it has seen),
// nesting past maxUsageDepth.
func refUsage(doc []byte) (r usageReport, ok bool) {
	if bytes.IndexByte(doc, '\\') >= 0 || bytes.Count(doc, []byte("{"))+bytes.Count(doc, []byte("[")) >= maxUsageDepth {
		return r, false
	}
	if len(responseKey.FindAll(doc, 2)) > 1 {
		return r, false
	}
	for _, ks := range [][]string{{`"usage"`}, {`"prompt_tokens"`, `"input_tokens"`}, {`"prompt_tokens_details"`, `"input_tokens_details"`}, {`"cached_tokens"`}} {
		n := 0
		for _, k := range ks {
			n += bytes.Count(doc, []byte(k))
		}
		if n > 1 {
			return r, false
		}
	}
	var raw json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(doc)).Decode(&raw); err != nil {
		return r, false
	}
	isObject := func(m json.RawMessage) bool { return len(m) > 0 && m[0] == '{' }
	if !isObject(raw) {
		return r, true
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return r, false
	}
	u, found := top["usage"]
	if resp := top["response"]; (!found || !isObject(u)) && isObject(resp) {
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(resp, &inner); err != nil {
			return r, false
		}
		u, found = inner["usage"]
	}
	if !found || !isObject(u) {
		return r, true
	}
	var usage map[string]json.RawMessage
	if err := json.Unmarshal(u, &usage); err != nil {
		return r, false
	}
	invalid := usageReport{result: usageInvalid}
	count := func(m json.RawMessage) (int64, bool) {
		if !plainCount.Match(m) {
			return 0, false
		}
		var n int64
		err := json.Unmarshal(m, &n)
		return n, err == nil
	}
	pm, found := usage["prompt_tokens"]
	if !found {
		pm, found = usage["input_tokens"]
	}
	if !found {
		return invalid, true
	}
	prompt, good := count(pm)
	if !good {
		return invalid, true
	}
	d, found := usage["prompt_tokens_details"]
	if !found {
		d, found = usage["input_tokens_details"]
	}
	if !found || !isObject(d) {
		return usageReport{result: usageNoDetails, prompt: prompt}, true
	}
	var details map[string]json.RawMessage
	if err := json.Unmarshal(d, &details); err != nil {
		return r, false
	}
	cm, found := details["cached_tokens"]
	if !found {
		return usageReport{result: usageNoDetails, prompt: prompt}, true
	}
	cached, good := count(cm)
	if !good || cached > prompt {
		return invalid, true
	}
	return usageReport{result: usageOK, prompt: prompt, cached: cached}, true
}
