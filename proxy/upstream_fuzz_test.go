package proxy

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzConnectionOptions: the options of a Connection field value are its
// comma-separated tokens without surrounding whitespace, as a plain split
// finds them, and each is listed.
func FuzzConnectionOptions(f *testing.F) {
	for _, s := range []string{"keep-alive", "Upgrade, HTTP2-Settings", " a ,, b\t,", ",", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if len(v) > 16<<10 {
			return // a header block is at most 16 KiB (MaxHeaderSize)
		}
		var want []string
		for _, o := range strings.Split(v, ",") {
			if o = strings.Trim(o, " \t"); o != "" {
				want = append(want, o)
			}
		}
		var got []string
		connectionOptions([]byte(v), func(o []byte) bool { got = append(got, string(o)); return true })
		if strings.Join(got, ",") != strings.Join(want, ",") || len(got) != len(want) || countOptions([]byte(v)) != len(want) {
			t.Fatalf("options of %q: %q, want %q", v, got, want)
		}
		// listed scans every option: checking each one is quadratic, so
		// check the first ones (the router refuses more than
		// maxConnectionOptions anyway).
		for _, o := range want[:min(len(want), maxConnectionOptions)] {
			up := []byte(o)
			for i, c := range up {
				if 'a' <= c && c <= 'z' {
					up[i] = c - 'a' + 'A'
				}
			}
			if !listed([]byte(v), up) {
				t.Fatalf("%q not listed in %q", o, v)
			}
		}
	})
}

// FuzzParseHops: accepted exactly when 1 to 3 decimal digits, with their
// value.
func FuzzParseHops(f *testing.F) {
	for _, s := range []string{"0", "4", "999", "1000", "-1", " 1", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, ok := parseHops([]byte(v))
		digits := len(v) >= 1 && len(v) <= 3 && strings.Trim(v, "0123456789") == ""
		if ok != digits {
			t.Fatalf("parseHops(%q) ok=%v", v, ok)
		}
		if want, _ := strconv.Atoi(v); ok && n != want {
			t.Fatalf("parseHops(%q) = %d", v, n)
		}
	})
}

// FuzzFirstHead: the verdict on a connection's first bytes does not depend
// on how reads split them, and agrees with a plain reading: TLS when the
// first byte is 0x16, a bare LF when an LF without CR comes before the
// first CRLFCRLF, done at that CRLFCRLF.
func FuzzFirstHead(f *testing.F) {
	f.Add([]byte("POST / HTTP/1.1\r\nHost: x\r\n\r\n{}"), 5)
	f.Add([]byte("POST / HTTP/1.1\nHost: x\n\n"), 3)
	f.Add([]byte{0x16, 0x03, 0x01, 0x00}, 1)
	f.Fuzz(func(t *testing.T, in []byte, cut int) {
		if cut < 0 || cut > len(in) {
			cut = len(in) / 2
		}
		var whole, split firstHead
		whole.inspect(in)
		split.inspect(in[:cut])
		if !split.done {
			split.inspect(in[cut:])
		}
		if whole.err != split.err || whole.done != split.done {
			t.Fatalf("%q: whole %v/%v, cut at %d %v/%v", in, whole.err, whole.done, cut, split.err, split.done)
		}
		var want error
		end := bytes.Index(in, []byte("\r\n\r\n"))
		head := in
		if end >= 0 {
			head = in[:end+4]
		}
		for i, c := range head {
			if c == '\n' && (i == 0 || head[i-1] != '\r') {
				want = errBareLF
				break
			}
		}
		if len(in) > 0 && in[0] == 0x16 {
			want = errTLSOnPlainPort
		}
		if whole.err != want || whole.done != (want != nil || end >= 0) {
			t.Fatalf("%q: %v done=%v, want %v", in, whole.err, whole.done, want)
		}
	})
}

// FuzzSniff: a response whose first bytes pass the sniff is one fasthttp
// reads as a final response (200-599), and one fasthttp reads as a switch
// of protocols or another status outside that range is never passed,
// however reads split it.
func FuzzSniff(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), 3)
	f.Add([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), 9)
	f.Add([]byte("\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n"), 1)
	f.Add([]byte("HTTP/1.1  101 x\r\n\r\n"), 0)
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 x\r\n\r\n"), 12)
	f.Fuzz(func(t *testing.T, in []byte, cut int) {
		if cut < 0 || cut > len(in) {
			cut = len(in) / 2
		}
		var c upstreamConn
		c.sniff(in[:cut])
		c.sniff(in[cut:])
		var h fasthttp.Response
		if err := h.Read(bufio.NewReader(bytes.NewReader(in))); err != nil {
			return
		}
		sc := h.StatusCode()
		if !c.noReuse.Load() && (sc < 200 || sc > 599) {
			t.Fatalf("%q (cut at %d): fasthttp reads status %d, and the connection would be reused", in, cut, sc)
		}
	})
}

// FuzzStripHop: after stripping, no hop-by-hop field and none that a
// Connection field named is left, and every other field is.
func FuzzStripHop(f *testing.F) {
	f.Add("Connection: keep-alive, X-A\r\nX-A: 1\r\nX-B: 2\r\nKeep-Alive: 5\r\n")
	f.Add("Proxy-Authorization: x\r\nTE: trailers\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n")
	f.Add("Connection: content-type, host\r\nContent-Type: a\r\nX-Warmroute-Hops: 2\r\n")
	f.Fuzz(func(t *testing.T, fields string) {
		var req fasthttp.RequestHeader
		raw := "GET / HTTP/1.1\r\nHost: h\r\n" + fields + "\r\n"
		if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		var resp fasthttp.ResponseHeader
		resp.DisableNormalizing()
		if err := resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n" + fields + "\r\n"))); err != nil {
			return
		}
		type kv struct{ k, v string }
		check := func(name string, all func() []kv, strip func(*[]byte) error, mask hopSet) {
			before := all()
			var opts []byte
			for _, f := range before {
				if hopField([]byte(f.k)) == hopConnection {
					opts = append(append(opts, f.v...), ',')
				}
			}
			var scratch []byte
			if err := strip(&scratch); err != nil {
				return
			}
			gone := func(k string) bool { return hopField([]byte(k))&mask != 0 || listed(opts, []byte(k)) }
			after := map[string]int{}
			for _, f := range all() {
				if gone(f.k) {
					t.Fatalf("%s: %q left after stripping %q", name, f.k, fields)
				}
				after[strings.ToLower(f.k)+": "+f.v]++
			}
			for _, f := range before {
				if !gone(f.k) && after[strings.ToLower(f.k)+": "+f.v] == 0 {
					t.Fatalf("%s: %q: %q removed from %q", name, f.k, f.v, fields)
				}
			}
		}
		check("request", func() (out []kv) {
			for k, v := range req.All() {
				out = append(out, kv{string(k), string(v)})
			}
			return out
		}, func(s *[]byte) error { return stripRequestHop(&req, requestHop, s) }, requestHop)
		check("response", func() (out []kv) {
			for k, v := range resp.All() {
				out = append(out, kv{string(k), string(v)})
			}
			return out
		}, func(s *[]byte) error { return stripResponseHop(&resp, responseHop, s) }, responseHop)
	})
}
