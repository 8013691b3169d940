package proxy

import (
	"fmt"
	"unicode/utf8"

	"github.com/warmroute/warmroute/ring"
)

// checkUTF8 refuses a JSON body that is not valid UTF-8, as the engines do
// (vLLM and SGLang decode the body as UTF-8 before parsing it and answer
// 400; TGI's JSON extractor refuses it too), so such a request never
// reaches one. The raw /invocations body is opaque and not checked.
// utf8.Valid checks 32 ASCII bytes per step: about 0.2 us for a 4 KiB body.
func checkUTF8(kc ring.KeyConfig, api ring.API, body []byte) error {
	if api == ring.Invocations && !kc.InvocationsJSON || utf8.Valid(body) {
		return nil
	}
	return fmt.Errorf("%w: invalid UTF-8 at byte %d", ring.ErrMalformedJSON, firstInvalidUTF8(body))
}

// firstInvalidUTF8 is the offset of the first byte that is not part of valid
// UTF-8, or -1.
func firstInvalidUTF8(p []byte) int {
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}
