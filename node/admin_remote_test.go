package node

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// remoteListener makes every accepted connection report a fixed
// non-loopback remote address, so the whole admin stack (server, mux,
// authorization, handlers) sees a client on another host while the test
// stays on loopback.
type remoteListener struct {
	net.Listener
	remote net.Addr
}

func (l remoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return remoteConn{c, l.remote}, nil
}

type remoteConn struct {
	net.Conn
	remote net.Addr
}

func (c remoteConn) RemoteAddr() net.Addr { return c.remote }

// TestAdminFromAnotherHost: over real HTTP, a client on another host needs
// the token for /debug/route and the admin API, reads included; with the
// token it gets its answer. Without a configured token, writes from another
// host are refused.
func TestAdminFromAnotherHost(t *testing.T) {
	e := newHoldEngine(t, 0)
	remote := &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 40000}
	start := func(token string) *Node {
		cfg := testConfig([]string{e.srv.URL})
		cfg.Admin.Token = token
		n, err := New(cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		n.adminLn = remoteListener{n.adminLn, remote}
		n = runBuilt(t, n)
		waitAgreed(t, n)
		return n
	}
	n := start("s3cret")
	admin := "http://" + n.AdminAddr().String()
	explain := func(token string) (int, string) {
		r := adminDo(t, "POST", admin+"/debug/route/v1/chat/completions", token, chat("hello"))
		return r.status, r.raw
	}
	if code, body := explain(""); code != http.StatusUnauthorized || !strings.Contains(body, `"unauthorized"`) {
		t.Errorf("/debug/route from another host without the token: %d %s", code, body)
	}
	if code, body := explain("wrong"); code != http.StatusUnauthorized {
		t.Errorf("/debug/route from another host with a wrong token: %d %s", code, body)
	}
	if code, body := explain("s3cret"); code != http.StatusOK || !strings.Contains(body, e.id()) {
		t.Errorf("/debug/route from another host with the token: %d %s", code, body)
	}
	if r := adminDo(t, "GET", admin+"/v1/backends", "", ""); r.status != http.StatusUnauthorized {
		t.Errorf("backend list from another host without the token: %d %s", r.status, r.raw)
	}
	if r := adminDo(t, "POST", admin+"/v1/backends", "s3cret", `{"url":"http://127.0.0.1:1"}`); r.status != http.StatusOK {
		t.Errorf("write from another host with the token: %d %s", r.status, r.raw)
	}

	// No token configured: writes from another host are refused.
	n2 := start("")
	admin2 := "http://" + n2.AdminAddr().String()
	if r := adminDo(t, "POST", admin2+"/v1/backends", "", `{"url":"http://127.0.0.1:1"}`); r.status != http.StatusForbidden || !strings.Contains(r.raw, "admin_token_required") {
		t.Errorf("write from another host with no token configured: %d %s", r.status, r.raw)
	}
}
