package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// The hostile-member tests play what issue 29 found against the real
// binary with cluster TLS on: a process with the gossip key and no
// certificate taking a dead router's name, a valid certificate of a
// router that never joined forging Raft headers, a certificate of the
// cluster CA issued for code signing, a retired router's certificate, a
// neighbour holding every connection slot, and the hints of 'warmroute
// tls ca create'. docs/security.md lists them by attacker.

// clusterDetail is the part of GET /v1/cluster these tests read.
type clusterDetail struct {
	Epoch uint64 `json:"epoch"`
	Raft  struct {
		RaftState string `json:"raft_state"`
		LeaderID  string `json:"leader_id"`
		Term      uint64 `json:"term"`
		LastIndex uint64 `json:"last_index"`
		Addr      string `json:"addr"`
		Servers   []struct {
			ID    string `json:"id"`
			Addr  string `json:"addr"`
			Voter bool   `json:"voter"`
		} `json:"servers"`
	} `json:"raft"`
	Members []struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		Reason   string `json:"reason"`
		RaftAddr string `json:"raft_addr"`
	} `json:"members"`
}

// serverAddr is id's address in the Raft configuration ("" when absent).
func (d clusterDetail) serverAddr(id string) string {
	for _, s := range d.Raft.Servers {
		if s.ID == id {
			return s.Addr
		}
	}
	return ""
}

// member returns the member named name at Raft address raftAddr ("" for
// any address).
func (d clusterDetail) member(name, raftAddr string) (state, reason string, ok bool) {
	for _, m := range d.Members {
		if m.Name == name && (raftAddr == "" || m.RaftAddr == raftAddr) {
			return m.State, m.Reason, true
		}
	}
	return "", "", false
}

func clusterOf(c *http.Client, p *router) (clusterDetail, error) {
	var d clusterDetail
	return d, getJSON(c, p.admin+"/v1/cluster", &d)
}

// tlsCluster starts n routers with cluster TLS from pki and the extra
// settings of base, on ports and data directories of their own chosen
// here, so that one can be started again as it was; it returns the
// routers and their arguments once they agree.
func tlsCluster(t *testing.T, pki *clusterPKI, base proc.ServeArgs, n int) ([]*router, []proc.ServeArgs) {
	t.Helper()
	args := make([]proc.ServeArgs, n)
	ps := spawnCluster(t, n, base, func(i int, a *proc.ServeArgs) {
		a.ClusterTLS = pki.files(t, a.NodeName)
		a.Listen, a.AdminListen, a.GossipListen, a.RaftListen = freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
		a.DataDir = t.TempDir()
		args[i] = *a
	})
	waitAgreed(t, pki.client(), ps, 30*time.Second)
	return ps, args
}

// leaderAmong returns the router the others name as their leader.
func leaderAmong(t *testing.T, c *http.Client, ps []*router) *router {
	t.Helper()
	d, err := clusterOf(c, ps[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.name == d.Raft.LeaderID {
			return p
		}
	}
	t.Fatalf("no router is the leader %q", d.Raft.LeaderID)
	return nil
}

func gossipKeyFile(t *testing.T) string {
	t.Helper()
	return writeSecret(t, "gossip.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32)))
}

// TestE2EImpostorGetsNoSeat: with the gossip key and no certificate, a
// process named like a dead router made the leader move that router's
// voter seat to its own address (raft membership changed
// action=update_addr); the real router, restarted, stayed a candidate
// and writes through it got 503 after 10 s until the impostor left. Now
// the seat keeps the address where the router proved its name, the
// impostor is refused, and the real router, back, follows the leader and
// takes writes at once.
func TestE2EImpostorGetsNoSeat(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	key := gossipKeyFile(t)
	ps, args := tlsCluster(t, pki, proc.ServeArgs{Backends: []string{e.addr()}, GossipKeyFile: key}, 3)
	c := pki.client()
	leader := leaderAmong(t, c, ps)
	vi := slices.IndexFunc(ps[1:], func(p *router) bool { return p != leader }) + 1 // a follower that joined through r0
	victim, va := ps[vi], args[vi]

	victim.Kill()
	// memberlist gives a dead member's name to another address 5 s after
	// it died (DeadNodeReclaimTime).
	if _, err := pollUntil(30*time.Second, func() (bool, error) {
		d, err := clusterOf(c, leader)
		_, _, present := d.member(victim.name, "")
		return err == nil && !present, nil
	}); err != nil {
		t.Fatalf("%s never left the leader's members: %v", victim.name, err)
	}
	time.Sleep(6 * time.Second)
	impRaft := freeAddr(t)
	spawnRouter(t, proc.ServeArgs{NodeName: victim.name, Backends: []string{e.addr()}, GossipKeyFile: key,
		Join: []string{leader.gossip}, RaftListen: impRaft})

	// The leader either moves the seat (the build before) or refuses the
	// impostor (now).
	var d clusterDetail
	if _, err := pollUntil(30*time.Second, func() (bool, error) {
		var err error
		if d, err = clusterOf(c, leader); err != nil {
			return false, err
		}
		state, _, _ := d.member(victim.name, impRaft)
		return d.serverAddr(victim.name) != va.RaftListen || state == "refused", nil
	}); err != nil {
		t.Fatalf("the impostor was neither refused nor given the seat: %v\n%+v", err, d)
	}
	if got := d.serverAddr(victim.name); got != va.RaftListen {
		t.Fatalf("the leader moved %s's seat to %q (the impostor is at %s)", victim.name, got, impRaft)
	}
	_, reason, _ := d.member(victim.name, impRaft)
	t.Logf("the leader refuses the impostor: %s", reason)

	// The real router comes back where it was.
	back := spawnRouter(t, va)
	start := time.Now()
	if _, err := pollUntil(30*time.Second, func() (bool, error) {
		if err := back.Alive(); err != nil {
			return false, err
		}
		// Another router may have won an election meanwhile (a loaded
		// machine): following any leader is the promise.
		d, err := clusterOf(c, back)
		return err == nil && d.Raft.RaftState == "Follower" && d.Raft.LeaderID != "" && d.Raft.LeaderID != victim.name, nil
	}); err != nil {
		d, _ := clusterOf(c, back)
		t.Fatalf("the real %s does not follow a leader: %v (raft %+v)\n%s", victim.name, err, d.Raft, back.Logs())
	}
	followed := time.Since(start)
	start = time.Now()
	code, body := adminDo(t, c, "POST", back.admin+"/v1/backends", `{"id":"through-the-real-one","url":"http://127.0.0.1:9"}`)
	if code != 200 {
		t.Fatalf("a write through the real %s: %d %s", victim.name, code, body)
	}
	t.Logf("the real %s followed a leader %v after it started; a write through it took %v", victim.name,
		followed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if d, err := clusterOf(c, leader); err != nil || d.serverAddr(victim.name) != va.RaftListen {
		t.Fatalf("%s's seat: %q (%v), want %s", victim.name, d.serverAddr(victim.name), err, va.RaftListen)
	}
	if strings.Contains(leader.Logs(), "server="+victim.name+" addr="+impRaft) {
		t.Fatalf("the leader's log shows a membership change to the impostor's address:\n%s", leader.Logs())
	}
}

// TestE2EStatusShowsRefusedMember: 'warmroute status' listed a member
// every router refused (gossip key, no certificate) as alive, and
// nothing was logged. Now every router's status shows it as refused,
// with the reason, and each router logs a warning naming it, its address
// and the reason.
func TestE2EStatusShowsRefusedMember(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	key := gossipKeyFile(t)
	ps, _ := tlsCluster(t, pki, proc.ServeArgs{Backends: []string{e.addr()}, GossipKeyFile: key}, 3)
	c := pki.client()
	impRaft := freeAddr(t)
	spawnRouter(t, proc.ServeArgs{NodeName: "r9", Backends: []string{e.addr()}, GossipKeyFile: key, Join: []string{ps[0].gossip}, RaftListen: impRaft})
	for _, p := range ps {
		var state, reason string
		if _, err := pollUntil(20*time.Second, func() (bool, error) {
			d, err := clusterOf(c, p)
			state, reason, _ = d.member("r9", impRaft)
			return err == nil && state == "refused" && reason != "", nil
		}); err != nil {
			t.Fatalf("%s shows r9 as %q (%q), want refused with a reason: %v", p.name, state, reason, err)
		}
	}
	caFile := pki.ca
	out, err := runCLI(t, "status", "--admin", ps[1].admin, "--ca-file", caFile)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "r9 ") {
			line = l
		}
	}
	if !strings.Contains(line, "refused (") {
		t.Fatalf("status lists r9 as %q, want refused with the reason:\n%s", line, out)
	}
	for _, p := range ps {
		logs := p.Logs()
		ok := false
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "member=r9") && strings.Contains(l, "addr="+impRaft) && strings.Contains(l, "reason=") {
				ok = true
			}
		}
		if !ok {
			t.Errorf("%s logged no warning naming r9, its address and the reason:\n%s", p.name, logs)
		}
	}
}

// raftDialer returns a dial function for the Raft port that speaks TLS
// with cert and the Raft preamble (claiming no cluster, which any router
// accepts), as a router's stream does.
func raftDialer(cert tls.Certificate) func(addr string) (net.Conn, error) {
	return func(addr string) (net.Conn, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr,
			&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte{'W', 'R', 'A', 'F', 'T', 1, 'R', 0}); err != nil {
			c.Close()
			return nil, err
		}
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			c.Close()
			return nil, fmt.Errorf("preamble: %w", err)
		}
		if _, err := io.ReadFull(c, make([]byte, hdr[7])); err != nil {
			c.Close()
			return nil, fmt.Errorf("preamble: %w", err)
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
}

// injectAs sends the router at raftAddr one AppendEntries of a higher
// term appending (and committing) an entry that adds backendID, with
// the header naming id at addr, over connections from dial; it tries
// every earlier term for the previous entry. It returns nil when the
// router accepted it.
func injectAs(st clusterDetail, raftAddr string, dial func(string) (net.Conn, error), id, addr, backendID string) error {
	stream := &attackStream{dial: dial, done: make(chan struct{})}
	trans := raft.NewNetworkTransport(stream, 1, 3*time.Second, io.Discard)
	defer trans.Close()
	cmd := fmt.Sprintf(`{"op":"upsert_backend","backend":{"id":%q,"url":"http://127.0.0.1:9","state":"active","source":"admin"}}`, backendID)
	term := st.Raft.Term + 7
	var last error
	for prev := st.Raft.Term; prev >= 1; prev-- {
		req := &raft.AppendEntriesRequest{
			RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)},
			Term:              term,
			Leader:            []byte(addr),
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

// loadCert reads a router's certificate and key files.
func loadCert(t *testing.T, files proc.ClusterTLS) tls.Certificate {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestE2ERPCHeadersTiedToCertificate: a valid router certificate of the
// cluster's CA for r9, a router that never joined, committed a backend
// on a follower with an AppendEntries whose header named the leader.
// Now a Raft RPC must name the router its connection's certificate
// proves, and a router outside the Raft configuration cannot lead: both
// forgeries are refused and counted, and nothing of them is applied.
func TestE2ERPCHeadersTiedToCertificate(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	ps, _ := tlsCluster(t, pki, proc.ServeArgs{Backends: []string{e.addr()}}, 3)
	c := pki.client()
	leader := leaderAmong(t, c, ps)
	follower := ps[slices.IndexFunc(ps, func(p *router) bool { return p != leader })]
	ld, err := clusterOf(c, leader)
	if err != nil {
		t.Fatal(err)
	}
	st, err := clusterOf(c, follower)
	if err != nil {
		t.Fatal(err)
	}
	dial := raftDialer(loadCert(t, pki.files(t, "r9")))
	if err := injectAs(st, st.Raft.Addr, dial, leader.name, ld.Raft.Addr, "forged-as-leader"); err == nil {
		t.Errorf("r9's AppendEntries naming the leader %s was accepted", leader.name)
	}
	if err := injectAs(st, st.Raft.Addr, dial, "r9", "127.0.0.1:1", "forged-as-r9"); err == nil {
		t.Errorf("r9's AppendEntries in its own name, from outside the Raft configuration, was accepted")
	}
	for _, id := range []string{"forged-as-leader", "forged-as-r9"} {
		if ok, err := hasBackend(c, follower.admin, id); err != nil || ok {
			t.Errorf("%s in %s's agreed state: %v %v", id, follower.name, ok, err)
		}
	}
	after, err := clusterOf(c, follower)
	if err != nil {
		t.Fatal(err)
	}
	if after.Raft.Term != st.Raft.Term {
		t.Errorf("the follower's term moved from %d to %d", st.Raft.Term, after.Raft.Term)
	}
	for _, reason := range []string{"rpc_id", "not_member"} {
		if n, _ := adminMetric(c, follower.admin, fmt.Sprintf(`warmroute_raft_rpcs_refused_total{reason=%q}`, reason)); n < 1 {
			t.Errorf("refused RPCs (%s) counted: %v", reason, n)
		}
	}
	// The cluster still commits.
	addBackend(t, c, follower.admin, `{"id":"after-forgery","url":"http://127.0.0.1:9"}`, 10*time.Second)
}

// TestE2EKeyUsageChecked: a certificate of the cluster CA naming a
// router but issued for code signing passed as that router: it
// forwarded an admin write that needed no token. Now the extended key
// usage is checked wherever a router certificate is: refused in the TLS
// handshake of the admin API and of Raft.
func TestE2EKeyUsageChecked(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	token := writeSecret(t, "admin.token", "usage-token")
	p := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: []string{e.addr()}, BootstrapExpect: 1, ClusterTLS: pki.files(t, "r0"), AdminTokenFile: token})
	c := pki.client()
	st := leaderOf(t, c, p)
	codeSigning := issueTLSUsage(t, pki, "r2", x509.ExtKeyUsageCodeSigning)

	// An admin write forwarded "by r2": no token, the certificate instead.
	tc := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{codeSigning}}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	req, _ := http.NewRequest("POST", p.admin+"/v1/backends", strings.NewReader(`{"id":"via-code-signing","url":"http://127.0.0.1:9"}`))
	req.Header.Set("X-Warmroute-Forwarded", "r2")
	if resp, err := hc.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("a write forwarded with a code-signing certificate was accepted: %s", b)
		}
	}
	if ok, err := hasBackend(c, p.admin, "via-code-signing"); err != nil || ok {
		t.Fatalf("the write is in the agreed state: %v %v", ok, err)
	}
	// Raft: the handshake fails; nothing reaches the log.
	var raftSt clusterDetail
	raftSt.Raft.Term, raftSt.Raft.LastIndex = st.Raft.Term, st.Raft.LastIndex
	if err := injectAs(raftSt, st.Raft.Addr, raftDialer(codeSigning), "r2", "127.0.0.1:1", "raft-code-signing"); err == nil {
		t.Error("an AppendEntries over a code-signing certificate was accepted")
	}
	if n, _ := adminMetric(c, p.admin, `warmroute_raft_connections_refused_total{reason="tls"}`); n < 1 {
		t.Errorf("refused Raft handshakes counted: %v", n)
	}
}

// issueTLSUsage signs, with the cluster CA, a certificate naming router
// name with the given extended key usages.
func issueTLSUsage(t *testing.T, pki *clusterPKI, name string, usages ...x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, URIs: []*url.URL{identity.URI(name)}, ExtKeyUsage: usages}
	der, key := signCert(t, tmpl, pki.auth)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// forwardAs sends an admin write to admin as if router name forwarded
// it, with cert, and returns the status (0: the connection failed).
func forwardAs(t *testing.T, admin, name string, cert tls.Certificate, body string) int {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
	req, _ := http.NewRequest("POST", admin+"/v1/backends", strings.NewReader(body))
	req.Header.Set("X-Warmroute-Forwarded", name)
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestE2ERevocation: a retired router's certificate kept its admin
// forwarding and Raft powers for up to a year: nothing revoked it. Now
// 'warmroute tls revoke' puts a router name or a certificate's serial
// number on a list agreed through Raft: the revoked router leaves the
// Raft configuration, and every router refuses its certificate, for
// forwarded writes too; taken off the list, it comes back.
func TestE2ERevocation(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	token := writeSecret(t, "admin.token", "revoke-token")
	ps, args := tlsCluster(t, pki, proc.ServeArgs{Backends: []string{e.addr()}, AdminTokenFile: token}, 3)
	c := pki.client()
	leader := leaderAmong(t, c, ps)
	retired := ps[slices.IndexFunc(ps, func(p *router) bool { return p != leader })]
	ri := slices.Index(ps, retired)
	retiredCert := loadCert(t, args[ri].ClusterTLS)
	admin := []string{"--admin", leader.admin, "--ca-file", pki.ca, "--token-file", token}

	// Before: the retired router's certificate forwards a write.
	if code := forwardAs(t, leader.admin, retired.name, retiredCert, `{"id":"before-revocation","url":"http://127.0.0.1:9"}`); code != 200 {
		t.Fatalf("a forwarded write with %s's certificate before any revocation: %d", retired.name, code)
	}
	out, err := runCLI(t, append([]string{"tls", "revoke", "--name", retired.name}, admin...)...)
	if err != nil {
		t.Fatalf("tls revoke: %v\n%s", err, out)
	}
	if _, err := pollUntil(20*time.Second, func() (bool, error) {
		d, err := clusterOf(c, leader)
		return err == nil && d.serverAddr(retired.name) == "", nil
	}); err != nil {
		d, _ := clusterOf(c, leader)
		t.Fatalf("%s still in the Raft configuration: %v %+v", retired.name, err, d.Raft.Servers)
	}
	if code := forwardAs(t, leader.admin, retired.name, retiredCert, `{"id":"after-revocation","url":"http://127.0.0.1:9"}`); code == 200 {
		t.Errorf("a forwarded write with the revoked %s's certificate was accepted", retired.name)
	}
	for _, p := range ps {
		if p == retired {
			continue
		}
		if ok, _ := hasBackend(c, p.admin, "after-revocation"); ok {
			t.Errorf("%s applied the revoked router's write", p.name)
		}
	}
	if !strings.Contains(retired.Logs(), "own certificate is revoked") {
		t.Errorf("the revoked router did not say so:\n%s", retired.Logs())
	}
	out, err = runCLI(t, append([]string{"tls", "revoke", "--list"}, admin...)...)
	if err != nil || !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
		return slices.Equal(strings.Fields(l), []string{"name", retired.name})
	}) {
		t.Fatalf("revoke --list does not show %s: %v\n%s", retired.name, err, out)
	}
	// The others still commit (with the token: writes need it).
	if code, body := adminDoToken(t, c, "POST", leader.admin+"/v1/backends", "revoke-token", `{"id":"without-the-retired","url":"http://127.0.0.1:9"}`); code != 200 {
		t.Fatalf("a write without the retired router: %d %s", code, body)
	}

	// By serial number: one certificate ends, another for the same name
	// still works.
	spare := pki.files(t, "r7")
	if out, err := runCLI(t, append([]string{"tls", "revoke", "--cert", spare.CertFile}, admin...)...); err != nil {
		t.Fatalf("tls revoke --cert: %v\n%s", err, out)
	}
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		return forwardAs(t, leader.admin, "r7", loadCert(t, spare), `{"id":"r7-old","url":"http://127.0.0.1:9"}`) != 200, nil
	}); err != nil {
		t.Errorf("the certificate revoked by serial number still forwards writes")
	}
	fresh := pki.files(t, "r7") // a new certificate (and serial) for r7
	if code := forwardAs(t, leader.admin, "r7", loadCert(t, fresh), `{"id":"r7-new","url":"http://127.0.0.1:9"}`); code != 200 {
		t.Errorf("a new certificate for r7 was refused: %d", code)
	}

	// Off the list, the retired router proves itself again and is back.
	if out, err := runCLI(t, append([]string{"tls", "unrevoke", "--name", retired.name}, admin...)...); err != nil {
		t.Fatalf("tls unrevoke: %v\n%s", err, out)
	}
	if _, err := pollUntil(30*time.Second, func() (bool, error) {
		d, err := clusterOf(c, leader)
		return err == nil && d.serverAddr(retired.name) != "", nil
	}); err != nil {
		t.Fatalf("%s not back in the Raft configuration after unrevoke: %v", retired.name, err)
	}
}

// holdConns keeps n idle TCP connections per local address open to addr
// for as long as the test runs (or until stop): one that the server
// closes is opened again after 20 ms, as a neighbour that wants to hold
// the listener's slots would. It returns stop, which waits for the
// holders to end, and a count of connections opened.
func holdConns(t *testing.T, addr string, ips []string, n int) (stop func(), opened *atomic.Int64) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	opened = &atomic.Int64{}
	for _, ip := range ips {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: time.Second}
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 1)
				for {
					c, err := d.Dial("tcp", addr)
					if err == nil {
						opened.Add(1)
						// Idle until the server closes it, or stop.
						for {
							_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
							_, err := c.Read(buf)
							var ne net.Error
							if stopped(done) || err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
								break
							}
						}
						c.Close()
					}
					select {
					case <-done:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
		}
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop, opened
}

// floodIPs are the neighbour's addresses: 5 on loopback, none the
// routers'.
var floodIPs = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"}

// failover kills the leader of ps (kill -9) and returns how long the
// others took to agree on a new leader that commits a write.
func failover(t *testing.T, c *http.Client, ps []*router) (time.Duration, *router) {
	t.Helper()
	leader := leaderAmong(t, c, ps)
	var rest []*router
	for _, p := range ps {
		if p != leader {
			rest = append(rest, p)
		}
	}
	start := time.Now()
	leader.Kill()
	took, err := pollUntil(60*time.Second, func() (bool, error) {
		var lead string
		for _, p := range rest {
			d, err := clusterOf(c, p)
			if err != nil || d.Raft.LeaderID == "" || d.Raft.LeaderID == leader.name || (lead != "" && d.Raft.LeaderID != lead) {
				return false, nil
			}
			lead = d.Raft.LeaderID
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("no new leader after killing %s: %v", leader.name, err)
	}
	addBackend(t, c, rest[0].admin, fmt.Sprintf(`{"id":"after-%s-died-%d","url":"http://127.0.0.1:9"}`, leader.name, start.UnixNano()), 30*time.Second)
	return took, leader
}

// TestE2ERaftSlotsUnderFlood: a neighbour with no credentials holding
// 5 addresses x 64 idle connections to the Raft ports of both followers
// held all their slots: a router could not connect to them, and after
// kill -9 of the leader, failover took 12-14 s instead of 1.3-2.8 s
// (raft-timeout 1s). Now connections that prove nothing only churn among
// themselves: a router connects through the flood at once, and failover
// under it takes about as long as without it.
func TestE2ERaftSlotsUnderFlood(t *testing.T) {
	t.Parallel()
	needCluster(t)
	integOnly(t, "floods the Raft listeners for about 75 s")
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	base := proc.ServeArgs{Backends: []string{e.addr()}, RaftTimeout: time.Second}
	c := pki.client()
	calmCluster, _ := tlsCluster(t, pki, base, 3) // for comparison, without a flood
	ps, args := tlsCluster(t, pki, base, 3)

	leader := leaderAmong(t, c, ps)
	var followers []string
	var opened []*atomic.Int64
	for i, p := range ps {
		if p != leader {
			_, n := holdConns(t, args[i].RaftListen, floodIPs, 64)
			followers, opened = append(followers, args[i].RaftListen), append(opened, n)
		}
	}
	// Let the flood take every slot it can.
	if _, err := pollUntil(20*time.Second, func() (bool, error) {
		return opened[0].Load() >= 256 && opened[1].Load() >= 256, nil
	}); err != nil {
		t.Fatalf("the flood opened %d and %d connections", opened[0].Load(), opened[1].Load())
	}
	time.Sleep(time.Second)

	// A router's new Raft connection (TLS and the preamble) gets through.
	dial := raftDialer(loadCert(t, pki.files(t, "r7")))
	for _, addr := range followers {
		for i := range 5 {
			start := time.Now()
			conn, err := dial(addr)
			if err != nil {
				t.Errorf("router connection %d to the flooded follower at %s: %v", i, addr, err)
				break // on to the failover, to measure it too
			}
			conn.Close()
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("router connection %d to %s took %v", i, addr, d)
			}
		}
	}

	// Failover. Routers keep the connections of their first election in
	// their pools, and a connection idle for a minute is dialled again
	// before its next use: past that, as in any cluster that has run for
	// a while, the followers must connect to each other anew.
	time.Sleep(65 * time.Second)
	calm, _ := failover(t, c, calmCluster)
	flooded, _ := failover(t, c, ps)
	t.Logf("failover after kill -9 of the leader (raft-timeout 1s): %v without a flood, %v with 5 addresses x 64 idle connections to each follower's Raft port",
		calm.Round(time.Millisecond), flooded.Round(time.Millisecond))
	if flooded > 8*time.Second {
		t.Errorf("failover under the flood took %v (%v without it)", flooded, calm)
	}
}

// TestE2EAdminSlotsUnderFlood: 256 idle connections on the admin port
// got the operator refused. Now the operator's connection takes the slot
// of a neighbour's idle one, and once it proves itself (the token, or
// loopback) it leaves the pool the neighbour contends for.
func TestE2EAdminSlotsUnderFlood(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	token := writeSecret(t, "admin.token", "flood-token")
	p := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: []string{e.addr()}, BootstrapExpect: 1, ClusterTLS: pki.files(t, "r0"), AdminTokenFile: token})
	c := pki.client()
	leaderOf(t, c, p)
	_, opened := holdConns(t, strings.TrimPrefix(p.admin, "https://"), floodIPs, 64)
	if _, err := pollUntil(20*time.Second, func() (bool, error) { return opened.Load() >= 300, nil }); err != nil {
		t.Fatalf("the flood opened %d connections", opened.Load())
	}
	time.Sleep(time.Second)
	for i := range 5 {
		fresh := pki.client() // a new connection each time
		req, _ := http.NewRequestWithContext(context.Background(), "GET", p.admin+"/v1/cluster", nil)
		req.Header.Set("Authorization", "Bearer flood-token")
		resp, err := fresh.Do(req)
		if err != nil {
			t.Fatalf("operator request %d with the admin port flooded: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("operator request %d: %d", i, resp.StatusCode)
		}
	}
	out, err := runCLI(t, "status", "--admin", p.admin, "--ca-file", pki.ca, "--token-file", token)
	if err != nil {
		t.Fatalf("warmroute status with the admin port flooded: %v\n%s", err, out)
	}
	if n, _ := adminMetric(c, p.admin, `warmroute_admin_connections_refused_total{reason="limit"}`); n == 0 {
		t.Error("no neighbour connection closed over the cap")
	}
}

// TestE2ETLSCAHintKeepsRouterKeysOut: 'warmroute tls ca create'
// suggested 'warmroute tls cert create --dir <the CA directory>', which
// writes router keys next to the CA key the README says to keep offline.
// Now the command it prints, run as printed, writes the router's files to
// another directory and leaves the CA directory with the CA's two files.
func TestE2ETLSCAHintKeepsRouterKeysOut(t *testing.T) {
	t.Parallel()
	needBinary(t)
	root := t.TempDir()
	caDir := filepath.Join(root, "ca")
	out, err := runCLI(t, "tls", "ca", "create", "--dir", caDir)
	if err != nil {
		t.Fatalf("ca create: %v\n%s", err, out)
	}
	var hint []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 3 && f[0] == "warmroute" && f[1] == "tls" && f[2] == "cert" {
			hint = f
		}
	}
	if hint == nil {
		t.Fatalf("no 'warmroute tls cert create' hint:\n%s", out)
	}
	for i, a := range hint {
		if a == "<router>" {
			hint[i] = "r1"
		}
	}
	cmd := execIn(root, hint[1:]...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the hint %q fails: %v\n%s", hint, err, b)
	}
	entries, err := os.ReadDir(caDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"warmroute-ca-key.pem", "warmroute-ca.pem"}) {
		t.Fatalf("after following the hint %q, the CA directory holds %v", hint, names)
	}
	keys, _ := filepath.Glob(filepath.Join(root, "*", "r1-key.pem"))
	if len(keys) != 1 {
		t.Fatalf("the hint %q wrote r1's key to %v", hint, keys)
	}
}

func stopped(done chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// execIn is the warmroute binary run with args in dir.
func execIn(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command(binPath, args...)
	cmd.Dir = dir
	return cmd
}

// adminDoToken is adminDo with the admin bearer token.
func adminDoToken(t *testing.T, c *http.Client, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}
