package proxy

import (
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
)

// HeaderHops counts the warmroute routers a request passed through: each
// sets it, one higher than it arrived with, on the requests it forwards.
const HeaderHops = "X-Warmroute-Hops"

// maxHopsLimit bounds Config.MaxHops; hopValues holds the field values a
// router may send, "1" to maxHopsLimit.
const maxHopsLimit = 64

var (
	hopsKey   = []byte(HeaderHops)
	hopValues = func() [][]byte {
		v := make([][]byte, maxHopsLimit+1)
		for i := range v {
			v[i] = strconv.AppendInt(nil, int64(i), 10)
		}
		return v
	}()
)

// hopSet is a set of the fields that concern one connection only (RFC 9110
// section 7.6.1) and a proxy must not forward, plus the ones the router
// replaces.
type hopSet uint16

const (
	hopConnection hopSet = 1 << iota
	hopKeepAlive
	hopProxy // Proxy-Connection, Proxy-Authorization, Proxy-Authenticate, any Proxy-*
	hopTE
	hopTrailer
	hopUpgrade
	hopTransferEncoding
	// hopExpect: the router has the whole request body before it forwards
	// it, so a 100-continue expectation is answered (by the server) and not
	// passed on.
	hopExpect
	// hopHops: X-Warmroute-Hops, replaced by this router's count.
	hopHops
)

// Fields removed from requests before they are forwarded, and from
// responses before they are passed on. A response's Transfer-Encoding is
// left to fasthttp, which frames the body it writes itself.
const (
	requestHop  = hopConnection | hopKeepAlive | hopProxy | hopTE | hopTrailer | hopUpgrade | hopTransferEncoding | hopExpect | hopHops
	responseHop = hopConnection | hopKeepAlive | hopProxy | hopTE | hopTrailer | hopUpgrade
)

// hopField classifies a field name (ASCII case-insensitively).
func hopField(k []byte) hopSet {
	if len(k) < 2 {
		return 0
	}
	switch k[0] | 0x20 {
	case 'c':
		if equalFold(k, "connection") {
			return hopConnection
		}
	case 'k':
		if equalFold(k, "keep-alive") {
			return hopKeepAlive
		}
	case 'p':
		if len(k) > 6 && equalFold(k[:6], "proxy-") {
			return hopProxy
		}
	case 't':
		switch {
		case equalFold(k, "te"):
			return hopTE
		case equalFold(k, "trailer"):
			return hopTrailer
		case equalFold(k, "transfer-encoding"):
			return hopTransferEncoding
		}
	case 'u':
		if equalFold(k, "upgrade") {
			return hopUpgrade
		}
	case 'e':
		if equalFold(k, "expect") {
			return hopExpect
		}
	case 'x':
		if equalFold(k, HeaderHops) {
			return hopHops
		}
	}
	return 0
}

// equalFold reports whether b equals s, ASCII case-insensitively.
func equalFold[S string | []byte](b []byte, s S) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// maxConnectionOptions bounds the field names one message's Connection
// fields may list, and maxHopDeletes the hop-by-hop fields removed from one
// message: each removal is a pass over the fields.
const (
	maxConnectionOptions = 64
	maxHopDeletes        = 128
)

var (
	errConnectionOptions = errors.New("the Connection field lists more than 64 options")
	errTooManyHopFields  = errors.New("more than 128 hop-by-hop fields")
)

// connectionOptions calls f with each option of a Connection field value
// (comma-separated tokens, optional whitespace around them), skipping
// empty ones, until f returns false.
func connectionOptions(v []byte, f func(opt []byte) bool) {
	for len(v) > 0 {
		i := 0
		for i < len(v) && v[i] != ',' {
			i++
		}
		opt := v[:i]
		if i < len(v) {
			v = v[i+1:]
		} else {
			v = v[i:]
		}
		for len(opt) > 0 && (opt[0] == ' ' || opt[0] == '\t') {
			opt = opt[1:]
		}
		for len(opt) > 0 && (opt[len(opt)-1] == ' ' || opt[len(opt)-1] == '\t') {
			opt = opt[:len(opt)-1]
		}
		if len(opt) > 0 && !f(opt) {
			return
		}
	}
}

// countOptions counts the options of a Connection field value.
func countOptions(v []byte) int {
	n := 0
	connectionOptions(v, func([]byte) bool { n++; return true })
	return n
}

// listed reports whether field name k is one of the options in v.
func listed(v, k []byte) bool {
	found := false
	connectionOptions(v, func(opt []byte) bool {
		found = equalFold(opt, k)
		return !found
	})
	return found
}

// stripRequestHop removes from h the hop-by-hop fields of the kinds in
// mask and the fields its Connection fields list. scratch is a buffer kept
// between calls, so the common case allocates nothing.
func stripRequestHop(h *fasthttp.RequestHeader, mask hopSet, scratch *[]byte) error {
	opts := (*scratch)[:0]
	for k, v := range h.All() {
		if hopField(k) == hopConnection {
			opts = append(append(opts, v...), ',')
		}
	}
	*scratch = opts
	if countOptions(opts) > maxConnectionOptions {
		return errConnectionOptions
	}
	for range maxHopDeletes {
		var victim []byte
		for k := range h.All() {
			if hopField(k)&mask != 0 || (len(opts) > 0 && listed(opts, k)) {
				victim = k
				break
			}
		}
		if victim == nil {
			return nil
		}
		h.DelBytes(victim)
	}
	return errTooManyHopFields
}

// stripResponseHop is stripRequestHop for a response. The two are written
// out for their concrete header types: behind an interface or a type
// parameter, the iterator closures escape and the request path allocates
// (TestRequestPathAllocationsWithConnectionField).
func stripResponseHop(h *fasthttp.ResponseHeader, mask hopSet, scratch *[]byte) error {
	opts := (*scratch)[:0]
	for k, v := range h.All() {
		if hopField(k) == hopConnection {
			opts = append(append(opts, v...), ',')
		}
	}
	*scratch = opts
	if countOptions(opts) > maxConnectionOptions {
		return errConnectionOptions
	}
	for range maxHopDeletes {
		var victim []byte
		for k := range h.All() {
			if hopField(k)&mask != 0 || (len(opts) > 0 && listed(opts, k)) {
				victim = k
				break
			}
		}
		if victim == nil {
			return nil
		}
		h.DelBytes(victim)
	}
	return errTooManyHopFields
}

// parseHops reads an X-Warmroute-Hops value: 1 to 3 decimal digits.
func parseHops(v []byte) (int, bool) {
	if len(v) == 0 || len(v) > 3 {
		return 0, false
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// onlyH2C reports whether every Upgrade field of h asks for HTTP/2 over
// cleartext (curl --http2 sends it): a server may ignore such a request
// for an upgrade and answer over HTTP/1.1 (RFC 9110 section 7.8), as the
// router does.
func onlyH2C(h *fasthttp.RequestHeader) bool {
	ok := true
	for k, v := range h.All() {
		if hopField(k) != hopUpgrade {
			continue
		}
		connectionOptions(v, func(opt []byte) bool {
			ok = ok && equalFold(opt, "h2c")
			return ok
		})
	}
	return ok
}
