package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/gossip/gossiptest"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// The trust tests play an attacker against the real binary: a process on
// the network with no credentials, one with a certificate of the wrong
// CA, an operator who restarts a router on the wrong data directory or
// whose disk damaged a file. Each says what the build before cluster
// authentication did. docs/security.md lists them by attacker.

// clusterPKI is a cluster CA and router certificates in a directory.
type clusterPKI struct {
	dir, ca string
	auth    *identity.CA
}

func newClusterPKI(t *testing.T) *clusterPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := identity.NewCA("test cluster CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &clusterPKI{dir: dir, ca: filepath.Join(dir, "ca.pem"), auth: ca}
	if err := os.WriteFile(p.ca, ca.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// files issues a certificate for router name and returns the files a
// router needs for cluster TLS.
func (p *clusterPKI) files(t *testing.T, name string) proc.ClusterTLS {
	t.Helper()
	cert, key, err := p.auth.Issue(identity.Request{Name: name, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cf, kf := filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	if err := os.WriteFile(cf, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return proc.ClusterTLS{CertFile: cf, KeyFile: kf, CAFile: p.ca}
}

// client is an HTTP client for the admin API of routers with this PKI
// (HTTPS with the cluster certificate; the CA is checked, not host names).
func (p *clusterPKI) client() *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(p.auth.Cert)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool})
			return err
		},
	}}}
}

// raftStatus is the part of GET /v1/cluster an attacker needs.
type raftStatus struct {
	Epoch uint64 `json:"epoch"`
	Raft  struct {
		Addr      string `json:"addr"`
		Term      uint64 `json:"term"`
		LastIndex uint64 `json:"last_index"`
		LeaderID  string `json:"leader_id"`
	} `json:"raft"`
}

// attackStream is a Raft stream layer that only dials: with dial when
// set, else in plaintext or with the given TLS configuration.
type attackStream struct {
	tls  *tls.Config
	dial func(addr string) (net.Conn, error)
	done chan struct{}
}

func (s *attackStream) Accept() (net.Conn, error) { <-s.done; return nil, net.ErrClosed }
func (s *attackStream) Close() error {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	return nil
}
func (s *attackStream) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
}
func (s *attackStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.dial != nil {
		return s.dial(string(addr))
	}
	d := &net.Dialer{Timeout: timeout}
	if s.tls != nil {
		return tls.DialWithDialer(d, "tcp", string(addr), s.tls)
	}
	return d.Dial("tcp", string(addr))
}

// leaderOf waits until the one-router cluster p is ready, has a leader and
// an agreed epoch, and returns its Raft status.
func leaderOf(t *testing.T, c *http.Client, p *router) raftStatus {
	t.Helper()
	if err := p.waitReady(); err != nil {
		t.Fatal(err)
	}
	var st raftStatus
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		err := getJSON(c, p.admin+"/v1/cluster", &st)
		return st.Raft.LeaderID != "" && st.Epoch > 0, err
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

// injectBackend sends the router at raftAddr what a Raft leader of a
// higher term would: one AppendEntries appending a command that adds a
// backend, committed at once. It knows the router's last index and term
// from its admin API (readable from loopback without a token) and tries
// every earlier term for the previous entry. It returns nil when the
// router accepted the entry.
func injectBackend(st raftStatus, raftAddr string, tc *tls.Config, backendID string) error {
	stream := &attackStream{tls: tc, done: make(chan struct{})}
	trans := raft.NewNetworkTransport(stream, 1, 2*time.Second, io.Discard)
	defer trans.Close()
	cmd := fmt.Sprintf(`{"op":"upsert_backend","backend":{"id":%q,"url":"http://127.0.0.1:9","state":"active","source":"admin"}}`, backendID)
	term := st.Raft.Term + 7
	var last error
	for prev := st.Raft.Term; prev >= 1; prev-- {
		req := &raft.AppendEntriesRequest{
			RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte("127.0.0.1:1")},
			Term:              term,
			PrevLogEntry:      st.Raft.LastIndex,
			PrevLogTerm:       prev,
			Entries:           []*raft.Log{{Index: st.Raft.LastIndex + 1, Term: term, Type: raft.LogCommand, Data: []byte(cmd)}},
			LeaderCommitIndex: st.Raft.LastIndex + 1,
		}
		var resp raft.AppendEntriesResponse
		if err := trans.AppendEntries("victim", raft.ServerAddress(raftAddr), req, &resp); err != nil {
			last = err
			continue
		}
		if resp.Success {
			return nil
		}
		last = fmt.Errorf("refused (term %d)", resp.Term)
	}
	return fmt.Errorf("AppendEntries not accepted: %w", last)
}

// hasBackend reports whether the router's agreed state lists id.
func hasBackend(c *http.Client, admin, id string) (bool, error) {
	var doc struct {
		Backends []struct {
			ID string `json:"id"`
		} `json:"backends"`
	}
	if err := getJSON(c, admin+"/v1/backends", &doc); err != nil {
		return false, err
	}
	for _, b := range doc.Backends {
		if b.ID == id {
			return true, nil
		}
	}
	return false, nil
}

// writeSecret writes a file with v and returns its path.
func writeSecret(t *testing.T, name, v string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func freePort(t *testing.T) string {
	_, port, _ := net.SplitHostPort(freeAddr(t))
	return port
}

// TestE2ERaftRefusesUnauthenticated: with the gossip key and admin token
// set but cluster TLS off, and the cluster ports on every interface (the
// README's cluster example of the earlier build), a process with no
// credentials sent one AppendEntries to the Raft port and it was applied:
// a made-up backend entered the ring and the router took the made-up
// term. Now such a router does not start; with cluster TLS, the same
// AppendEntries gets no further than the TLS handshake, with no
// certificate, with another CA's, or with this CA's certificate that names
// no router.
func TestE2ERaftRefusesUnauthenticated(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	key := writeSecret(t, "gossip.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	token := writeSecret(t, "admin.token", "secret-token")
	exposed := func(name string, tls proc.ClusterTLS) proc.ServeArgs {
		g, r := freePort(t), freePort(t)
		return proc.ServeArgs{NodeName: name, Backends: []string{e.addr()}, BootstrapExpect: 1,
			GossipListen: "0.0.0.0:" + g, GossipAdvertise: "127.0.0.1:" + g,
			RaftListen: "0.0.0.0:" + r, RaftAdvertise: "127.0.0.1:" + r,
			GossipKeyFile: key, AdminTokenFile: token, ClusterTLS: tls}
	}

	// No cluster TLS: refused at start, naming the fix.
	p := spawnRouter(t, exposed("r0", proc.ClusterTLS{}))
	select {
	case <-p.Done():
		p.Kill() // gone, as it should be: nothing for the cleanup to stop
		out := p.Logs()
		if p.Err() == nil || !strings.Contains(out, "cluster TLS is off") || !strings.Contains(out, "warmroute tls") || !strings.Contains(out, "--allow-insecure-cluster") {
			t.Fatalf("exit %v; want a refusal naming cluster TLS and the way out:\n%s", p.Err(), out)
		}
	case <-time.After(15 * time.Second):
		// The earlier build: it runs. Show what that allows.
		if err := p.waitReady(); err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Timeout: 5 * time.Second}
		var st raftStatus
		if err := getJSON(c, p.admin+"/v1/cluster", &st); err != nil {
			t.Fatal(err)
		}
		err := injectBackend(st, st.Raft.Addr, nil, "intruder-backend")
		t.Fatalf("a router with exposed cluster ports and no cluster TLS started; an unauthenticated AppendEntries: %v", err)
	}

	// With cluster TLS the router starts, and nobody without a router
	// certificate of its CA gets a Raft message through.
	pki := newClusterPKI(t)
	p = spawnRouter(t, exposed("r1", pki.files(t, "r1")))
	c := pki.client()
	st := leaderOf(t, c, p)

	otherCA, err := identity.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	routerOfOtherCA := issueTLS(t, otherCA, identity.URI("r9").String())
	noRouterName := issueTLS(t, pki.auth) // the right CA, but it names no router
	attacks := map[string]*tls.Config{
		"plaintext":                      nil,
		"TLS without a certificate":      {InsecureSkipVerify: true},
		"another CA's router":            {InsecureSkipVerify: true, Certificates: []tls.Certificate{routerOfOtherCA}},
		"a certificate naming no router": {InsecureSkipVerify: true, Certificates: []tls.Certificate{noRouterName}},
	}
	for what, tc := range attacks {
		if err := injectBackend(st, st.Raft.Addr, tc, "intruder-backend"); err == nil {
			t.Errorf("%s: the router accepted the AppendEntries", what)
		}
	}
	var after raftStatus
	if err := getJSON(c, p.admin+"/v1/cluster", &after); err != nil {
		t.Fatal(err)
	}
	if after.Raft.Term != st.Raft.Term {
		t.Errorf("term moved from %d to %d", st.Raft.Term, after.Raft.Term)
	}
	if ok, err := hasBackend(c, p.admin, "intruder-backend"); err != nil || ok {
		t.Fatalf("intruder backend in the agreed state: %v %v", ok, err)
	}
	if n, _ := adminMetric(c, p.admin, `warmroute_raft_connections_refused_total{reason="tls"}`); n < 3 {
		t.Errorf("refused TLS handshakes counted: %v, want at least 3", n)
	}
}

// issueTLS signs a client certificate with ca, with the given URI SANs.
func issueTLS(t *testing.T, ca *identity.CA, uris ...string) tls.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "r9"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, key := signCert(t, tmpl, ca)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// adminMetric reads one sample, by its exact name and labels as exposed
// ("name" or `name{label="v"}`), from a router's /metrics.
func adminMetric(c *http.Client, admin, name string) (float64, error) {
	resp, err := c.Get(admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

// TestE2ERaftListenerBounded: the Raft listener took any number of
// connections, never timed out an idle one, and each cost 100-145 KB that
// were not given back; about 15,000 of them OOM-killed a router. Now a
// flood of 3,000 idle connections is refused beyond the caps, the ones it
// holds are closed after the handshake timeout, the router's memory grows
// by a few megabytes at most, and the cluster keeps committing writes.
func TestE2ERaftListenerBounded(t *testing.T) {
	t.Parallel()
	needCluster(t)
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < 4096 {
		rl.Cur = min(rl.Max, 8192)
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	p := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: []string{e.addr()}, BootstrapExpect: 1, ClusterTLS: pki.files(t, "r0")})
	c := pki.client()
	st := leaderOf(t, c, p)
	before := procStatus(t, p.Pid(), "VmRSS") << 10

	const flood = 3000
	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, cn := range conns {
			cn.Close()
		}
	}()
	for i := 0; i < flood; i++ {
		cn, err := net.DialTimeout("tcp", st.Raft.Addr, 2*time.Second)
		if err != nil {
			break // the kernel's backlog is full: also a bound
		}
		conns = append(conns, cn)
	}
	t.Logf("opened %d connections", len(conns))
	time.Sleep(500 * time.Millisecond) // let the router accept what it will
	peak := procStatus(t, p.Pid(), "VmRSS") << 10

	// Every connection ends: at once over the caps, after the handshake
	// timeout (5 s) for the ones held.
	closed := 0
	deadline := time.Now().Add(15 * time.Second)
	for _, cn := range conns {
		_ = cn.SetReadDeadline(deadline)
		if _, err := cn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	t.Logf("router RSS %d KiB before, %d KiB with the flood; %d of %d connections closed by the router",
		before>>10, peak>>10, closed, len(conns))
	if closed != len(conns) {
		t.Errorf("%d of %d idle connections still open after 15 s", len(conns)-closed, len(conns))
	}
	if grew := peak - before; grew > 32<<20 {
		t.Errorf("router RSS grew by %d MiB under %d idle Raft connections", grew>>20, len(conns))
	}
	if n, _ := adminMetric(c, p.admin, `warmroute_raft_connections_refused_total{reason="limit_per_ip"}`); n == 0 {
		t.Error("no connection refused over the per-address cap")
	}
	// The router still commits writes.
	req, _ := http.NewRequest("POST", p.admin+"/v1/backends", strings.NewReader(`{"id":"after-flood","url":"http://127.0.0.1:9"}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("write after the flood: %d %s", resp.StatusCode, b)
	}
}

// adminDo sends an admin request and returns the status and body.
func adminDo(t *testing.T, c *http.Client, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestE2EForeignDataDirRefused: a router restarted on another cluster's
// data directory (same node name) became leader, the two logs merged into
// a hybrid that survived a full restart, and acknowledged writes of the
// real cluster were lost. Now every Raft connection starts by naming the
// cluster its data belong to: the real cluster refuses the intruder, and
// the intruder, outnumbered, stops with an error naming both clusters.
func TestE2EForeignDataDirRefused(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	backends := []string{e.addr()}
	c := &http.Client{Timeout: 5 * time.Second}

	// Cluster B: one router r0 with a backend only it has.
	dirB := t.TempDir()
	seedDataDir(t, c, backends, dirB, "only-in-b")

	// Cluster A: three routers, a write acknowledged.
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	ps := spawnCluster(t, 3, proc.ServeArgs{Backends: backends}, func(i int, a *proc.ServeArgs) { a.DataDir = dirs[i] })
	if _, err := pollUntil(20*time.Second, func() (bool, error) {
		code, _ := adminDo(t, c, "POST", ps[1].admin+"/v1/backends", `{"id":"only-in-a","url":"http://127.0.0.1:9"}`)
		return code == 200, nil
	}); err != nil {
		t.Fatal(err)
	}
	idA, _ := os.ReadFile(filepath.Join(dirs[1], "cluster-id"))
	idB, _ := os.ReadFile(filepath.Join(dirB, "cluster-id"))

	// r0 of A restarts on B's data directory.
	ps[0].Stop(10 * time.Second)
	intruder := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: backends, DataDir: dirB, Join: []string{ps[1].gossip}})
	select {
	case <-intruder.Done():
		intruder.Kill() // gone, as it should be: nothing for the cleanup to stop
		out := intruder.Logs()
		if intruder.Err() == nil || !strings.Contains(out, "another cluster") ||
			len(idA) == 0 || len(idB) == 0 ||
			!strings.Contains(out, strings.TrimSpace(string(idA))) || !strings.Contains(out, strings.TrimSpace(string(idB))) {
			t.Fatalf("exit %v; want an error naming clusters %s and %s:\n%s", intruder.Err(), idA, idB, out)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the router on another cluster's data directory still runs after 30 s\n%s", intruder.Logs())
	}
	// A is untouched: its write stands, nothing of B entered it.
	for _, p := range ps[1:] {
		if ok, err := hasBackend(c, p.admin, "only-in-a"); err != nil || !ok {
			t.Errorf("%s lost the acknowledged write: %v %v", p.name, ok, err)
		}
		if ok, err := hasBackend(c, p.admin, "only-in-b"); err != nil || ok {
			t.Errorf("%s took cluster B's backend: %v %v", p.name, ok, err)
		}
	}
	if code, body := adminDo(t, c, "POST", ps[2].admin+"/v1/backends", `{"id":"a-still-writes","url":"http://127.0.0.1:9"}`); code != 200 {
		t.Errorf("cluster A no longer takes writes: %d %s", code, body)
	}
}

// seedDataDir runs router r0 alone (--bootstrap-expect 1) on dir, adds a
// backend with each of ids through its admin API, and stops it.
func seedDataDir(t *testing.T, c *http.Client, backends []string, dir string, ids ...string) {
	t.Helper()
	p := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: backends, BootstrapExpect: 1, DataDir: dir})
	if err := p.waitReady(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		addBackend(t, c, p.admin, fmt.Sprintf(`{"id":%q,"url":"http://127.0.0.1:9"}`, id), 10*time.Second)
	}
	p.Stop(10 * time.Second)
}

// addBackend posts body to the router's /v1/backends until it is
// accepted (the first write waits for a leader), or fails the test.
func addBackend(t *testing.T, c *http.Client, admin, body string, within time.Duration) {
	t.Helper()
	var code int
	var out string
	if _, err := pollUntil(within, func() (bool, error) {
		code, out = adminDo(t, c, "POST", admin+"/v1/backends", body)
		return code == 200, nil
	}); err != nil {
		t.Fatalf("POST %s: %v (last answer %d %s)", body, err, code, out)
	}
}

// TestE2EStateCacheNeverAheadOfRaft: a state cache with a higher epoch
// (damaged or another cluster's) was routed on for over a minute, across
// a cluster write and a restart, while Raft had applied far less. Now the
// cache is served only when the router's own Raft log holds that state at
// that epoch.
func TestE2EStateCacheNeverAheadOfRaft(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	c := &http.Client{Timeout: 5 * time.Second}
	dir := t.TempDir()
	seedDataDir(t, c, []string{e.addr()}, dir, "real")

	// Forge the cache: far ahead, with a backend of the attacker's (its
	// id sorts last: the state keeps backends sorted, and an unsorted one
	// fails validation before anything else).
	path := filepath.Join(dir, "state.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cache map[string]any
	if err := json.Unmarshal(b, &cache); err != nil {
		t.Fatal(err)
	}
	cache["epoch"] = 5000
	st := cache["state"].(map[string]any)
	st["backends"] = append(st["backends"].([]any), map[string]any{"id": "zz-forged", "url": "http://127.0.0.1:9", "state": "active", "source": "admin"})
	if b, err = json.Marshal(cache); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}

	p := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: []string{e.addr()}, DataDir: dir})
	if err := p.waitReady(); err != nil {
		t.Fatal(err)
	}
	checked := 0 // status reads that answered: one that times out on a loaded machine proves nothing either way
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) || checked < 3; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end.Add(30 * time.Second)) {
			t.Fatalf("only %d status reads answered", checked)
		}
		var s struct {
			Epoch    uint64 `json:"epoch"`
			Backends []struct {
				ID string `json:"id"`
			} `json:"backends"`
		}
		if err := getJSON(c, p.admin+"/status", &s); err != nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				t.Logf("status: %v", err)
				continue
			}
			t.Fatal(err)
		}
		checked++
		for _, b := range s.Backends {
			if b.ID == "zz-forged" {
				t.Fatalf("routing on the forged cache (epoch %d)", s.Epoch)
			}
		}
		if s.Epoch >= 5000 {
			t.Fatalf("epoch %d: the forged cache's", s.Epoch)
		}
	}
	if ok, err := hasBackend(c, p.admin, "real"); err != nil || !ok {
		t.Fatalf("the real state is gone: %v %v", ok, err)
	}
	if !strings.Contains(p.Logs(), "ignoring the cached state") {
		t.Errorf("the forged cache was not reported:\n%s", p.Logs())
	}
}

// TestE2ECorruptEntryHalts: one byte changed inside a committed entry on
// one router's disk made it route differently at the same epoch, with
// nothing logged: the WAL checks the CRC of its last batch only, and the
// state machine skipped entries it could not decode. Now every entry
// carries a checksum; the router stops applying, says so, and reports not
// ready instead of routing on a state no other router has.
func TestE2ECorruptEntryHalts(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	c := &http.Client{Timeout: 5 * time.Second}
	dir := t.TempDir()
	// The target entry, then more so that it is not in the last batch.
	seedDataDir(t, c, []string{e.addr()}, dir, "target-aaaa", "later-1", "later-2", "later-3")

	// Change one byte: the JSON stays valid, the backend's id changes.
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	changed := 0
	for _, seg := range segs {
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte("target-aaaa")); i >= 0 {
			b[i+len("target-aaaa")-1] = 'b'
			if err := os.WriteFile(seg, b, 0o640); err != nil {
				t.Fatal(err)
			}
			changed++
		}
	}
	if changed != 1 {
		t.Fatalf("found the entry in %d WAL segments, want 1", changed)
	}
	os.Remove(filepath.Join(dir, "state.json"))

	p := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: []string{e.addr()}, DataDir: dir})
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		if err := p.Alive(); err != nil {
			return false, err
		}
		v, err := adminMetric(c, p.admin, "warmroute_raft_fsm_halted")
		return err == nil && v == 1, nil
	}); err != nil {
		t.Fatalf("the router did not halt on the damaged entry: %v\n%s", err, p.Logs())
	}
	resp, err := http.Get(p.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "stopped applying") {
		t.Errorf("/readyz of a halted router: %d %s", resp.StatusCode, body)
	}
	var s struct {
		Halted string `json:"halted"`
	}
	if err := getJSON(c, p.admin+"/status", &s); err != nil || !strings.Contains(s.Halted, "checksum") {
		t.Errorf("/status halted = %q (%v), want the checksum failure", s.Halted, err)
	}
	if ok, _ := hasBackend(c, p.admin, "target-aaab"); ok {
		t.Error("the damaged entry was applied")
	}
	if !strings.Contains(p.Logs(), "level=ERROR") {
		t.Errorf("nothing logged as an error:\n%s", p.Logs())
	}
}

// TestE2EAdminInput: ids with control characters were accepted (and broke
// Go HTTP clients reading the answer); a PATCH naming PrefixLength and
// prefix_length took one at random; a write to a follower whose leader
// was paused waited 10 s and failed although a new leader existed after
// about 1.3 s.
func TestE2EAdminInput(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	ps := startProcCluster(t, []string{e.addr()}, 3)
	c := &http.Client{Timeout: 15 * time.Second}

	for _, body := range []string{
		`{"id":"evil\u0001id","url":"http://127.0.0.1:9"}`,
		`{"id":"evil\u007fid","url":"http://127.0.0.1:9"}`,
		`{"id":"ok","url":"http://127.0.0.1:9","zone":"z\u000a1"}`,
		`{"id":"ok","url":"http://127.0.0.1:9","labels":{"k":"v\u0000"}}`,
	} {
		if code, out := adminDo(t, c, "POST", ps[0].admin+"/v1/backends", body); code != 400 {
			t.Errorf("POST %s: %d %s, want 400", body, code, out)
		}
	}
	for _, body := range []string{`{"PrefixLength":2048,"prefix_length":8192}`, `{"prefix_length":2048,"prefix_length":8192}`} {
		if code, out := adminDo(t, c, "PATCH", ps[0].admin+"/v1/config", body); code != 400 || !strings.Contains(out, "twice") {
			t.Errorf("PATCH %s: %d %s, want 400 naming the field given twice", body, code, out)
		}
	}

	// Pause the leader; a write to a follower reaches the next leader.
	var d clusterDoc
	if err := getJSON(c, ps[0].admin+"/v1/cluster", &d); err != nil {
		t.Fatal(err)
	}
	var leader, follower *router
	for _, p := range ps {
		if p.name == d.Raft.LeaderID {
			leader = p
		} else {
			follower = p
		}
	}
	if err := leader.Pause(); err != nil {
		t.Fatal(err)
	}
	defer leader.Continue()
	start := time.Now()
	code, out := adminDo(t, c, "POST", follower.admin+"/v1/backends", `{"id":"while-paused","url":"http://127.0.0.1:9"}`)
	took := time.Since(start)
	t.Logf("write through a follower while the leader is paused: %d in %v", code, took.Round(time.Millisecond))
	if code != 200 {
		t.Fatalf("write while the leader is paused: %d %s", code, out)
	}
	if took > 6*time.Second {
		t.Errorf("the write took %v; a new leader is elected within about a second (raft-timeout 200ms)", took)
	}
}

// startTLSProcCluster starts n routers with cluster TLS (and the extra
// flags) that bootstrap together, and waits until they agree on a leader
// and an epoch. Their admin URLs are HTTPS; pki.client() reads them.
func startTLSProcCluster(t *testing.T, pki *clusterPKI, backends []string, n int, a proc.ServeArgs) []*router {
	t.Helper()
	a.Backends = backends
	ps := spawnCluster(t, n, a, func(_ int, a *proc.ServeArgs) { a.ClusterTLS = pki.files(t, a.NodeName) })
	waitAgreed(t, pki.client(), ps, 30*time.Second)
	return ps
}

// TestE2EGossipFiguresTiedToSender: a holder of the gossip key could
// publish load figures and health verdicts in other routers' names (two
// healthy backends were committed down) and a negative in-flight count
// was accepted. Now, with cluster TLS, figures count only when signed by
// the certificate of the router they name: the same forged packets,
// unsigned or signed with another CA's certificate, change nothing.
func TestE2EGossipFiguresTiedToSender(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e1, e2 := newEngine(t, 0, 0, 1), newEngine(t, 0, 0, 1)
	key := bytes.Repeat([]byte{9}, 32)
	keyFile := writeSecret(t, "gossip.key", base64.StdEncoding.EncodeToString(key))
	pki := newClusterPKI(t)
	ps := startTLSProcCluster(t, pki, []string{e1.addr(), e2.addr()}, 3, proc.ServeArgs{GossipKeyFile: keyFile})
	c := pki.client()
	ids := []string{e1.addr(), e2.addr()}

	otherCA, err := identity.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cp, kp, err := otherCA.Issue(identity.Request{Name: "r0", Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	otherCert, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(otherCA.Cert)
	impostor, err := identity.NewBundle(otherCert, roots) // "r0", of another CA
	if err != nil {
		t.Fatal(err)
	}

	// Every router's name, failing verdicts on both backends, a negative
	// and a huge in-flight count: for 4 s, every 50 ms, to every router.
	instance := uint64(time.Now().Add(time.Hour).UnixNano())
	forged := []gossip.BackendLoad{{Backend: ids[0], InFlight: -50, Failing: true}, {Backend: ids[1], InFlight: 1000, Failing: true}}
	end := time.Now().Add(4 * time.Second)
	checked := 0 // status reads that answered: a read that times out on a loaded machine proves nothing either way
	for seq := uint64(1); time.Now().Before(end); seq++ {
		for _, origin := range []string{"r0", "r1", "r2"} {
			unsigned, err := gossiptest.ForgePublish(key, origin, instance, seq, forged)
			if err != nil {
				t.Fatal(err)
			}
			signed, err := gossiptest.ForgeSigned(key, impostor, origin, instance, seq, forged)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.name != origin {
					if err := gossiptest.Send(p.gossip, unsigned, signed); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		for _, p := range ps {
			own, remote, err := liveLoads(c, p)
			if err != nil {
				t.Logf("%s: status: %v", p.name, err)
				continue
			}
			checked++
			for id, v := range remote {
				if v != 0 {
					t.Fatalf("%s counts %d remote in flight for %s (own %v): forged figures were taken", p.name, v, id, own)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if checked < 3 {
		t.Fatalf("only %d status reads answered while the forged figures were sent", checked)
	}
	for _, p := range ps {
		for _, id := range ids {
			var doc struct {
				Backend struct {
					State     string   `json:"state"`
					FailingOn []string `json:"failing_on"`
				} `json:"backend"`
			}
			if err := getJSON(c, p.admin+"/v1/backends/"+id, &doc); err != nil {
				t.Fatal(err)
			}
			if doc.Backend.State != "active" || len(doc.Backend.FailingOn) > 0 {
				t.Errorf("%s: backend %s %s, failing on %v: forged verdicts were taken", p.name, id, doc.Backend.State, doc.Backend.FailingOn)
			}
		}
	}
	rejected := 0.0
	for _, p := range ps {
		for _, reason := range []string{"unsigned", "bad_signature", "unknown_key", "bad_chain", "wrong_name"} {
			v, _ := adminMetric(c, p.admin, fmt.Sprintf(`warmroute_gossip_rejected_total{reason=%q}`, reason))
			rejected += v
		}
	}
	if rejected == 0 {
		t.Error("no forged packet counted as rejected")
	}
}

// TestE2ESeedsOnSharedPort: three routers on 127.0.0.2, .3 and .4, all on
// the same gossip port, each given all three as seeds, took each other
// for themselves and never joined, silently. Now they form one cluster.
func TestE2ESeedsOnSharedPort(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		var seeds []string
		for _, ip := range ips {
			seeds = append(seeds, net.JoinHostPort(ip, port))
		}
		var ps []*router
		for i, ip := range ips {
			ps = append(ps, spawnRouter(t, proc.ServeArgs{NodeName: fmt.Sprintf("r%d", i), Backends: []string{e.addr()},
				GossipListen: net.JoinHostPort(ip, port), RaftListen: net.JoinHostPort(ip, "0"), Join: seeds, BootstrapExpect: 3}))
		}
		c := &http.Client{Timeout: 5 * time.Second}
		_, err := pollUntil(20*time.Second, func() (bool, error) {
			for _, p := range ps {
				if err := p.Alive(); err != nil {
					return false, err
				}
				var d clusterDoc
				if err := getJSON(c, p.admin+"/v1/cluster", &d); err != nil || len(d.Members) != 3 || d.Raft.LeaderID == "" {
					return false, nil
				}
			}
			return true, nil
		})
		if err == nil {
			return
		}
		if attempt < 3 && slices.ContainsFunc(ps, (*router).portTaken) {
			for _, p := range ps {
				p.Kill()
			}
			continue
		}
		var d clusterDoc
		_ = getJSON(c, ps[0].admin+"/v1/cluster", &d)
		t.Fatalf("routers on %v sharing port %s did not form one cluster: %v (r0 sees %v)\n%s", ips, port, err, memberNames(d), ps[0].Logs())
	}
}

// localNonLoopback returns an IPv4 address of this machine that is not
// loopback, or "".
func localNonLoopback() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

// TestE2EMetricsNeedToken: /metrics on an admin listener other hosts
// reach needed no token while /status did. Now every read from another
// host needs the token, /metrics included, unless --admin-public-metrics
// says otherwise.
func TestE2EMetricsNeedToken(t *testing.T) {
	t.Parallel()
	needBinary(t)
	ip := localNonLoopback()
	if ip == "" {
		t.Skip("no non-loopback address to reach the admin listener from")
	}
	e := newEngine(t, 0, 0, 1)
	token := writeSecret(t, "admin.token", "metrics-token")
	// A client whose requests come from ip, not from loopback.
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}}
	get := func(url, tok string) int {
		req, _ := http.NewRequest("GET", url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, public := range []bool{false, true} {
		port := freePort(t)
		startRouter(t, proc.ServeArgs{Backends: []string{e.addr()}, AdminTokenFile: token, AdminListen: "0.0.0.0:" + port,
			AdminPublicMetrics: public})
		base := "http://" + net.JoinHostPort(ip, port)
		want := map[string][2]int{ // without, with the token
			"/metrics": {401, 200},
			"/status":  {401, 200},
		}
		if public {
			want["/metrics"] = [2]int{200, 200}
		}
		for path, w := range want {
			if got := get(base+path, ""); got != w[0] {
				t.Errorf("public-metrics=%v: GET %s from %s without the token: %d, want %d", public, path, ip, got, w[0])
			}
			if got := get(base+path, "metrics-token"); got != w[1] {
				t.Errorf("public-metrics=%v: GET %s with the token: %d, want %d", public, path, got, w[1])
			}
		}
	}
}
