package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/testkit"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
	pool *x509.CertPool
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := filepath.Join(dir, name+"-ca.pem")
	os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, file: file, pool: pool}
}

// issue writes a certificate for 127.0.0.1 signed by the CA, naming
// router name.
func (ca *testCA) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		URIs:        []*url.URL{identity.URI(name)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certFile, keyFile
}

func TestClientTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "clients")
	cert, key := ca.issue(t, dir, "router")
	e := newHoldEngine(t, 0)
	cfg := testConfig([]string{e.srv.URL})
	cfg.TLS.CertFile, cfg.TLS.KeyFile = cert, key
	n := runNode(t, cfg)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}}}
	resp, err := hc.Post("https://"+n.TrafficAddr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chat("over tls")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Warmroute-Backend") != e.id() {
		t.Fatalf("TLS request: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if _, err := http.Post("http://"+n.TrafficAddr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chat("plain"))); err == nil {
		// A plaintext request to a TLS listener gets no HTTP answer.
		t.Log("plaintext request answered (TLS listeners reply with a TLS alert read as a malformed response)")
	}
}

// TestClusterMutualTLS runs three routers whose Raft and admin traffic uses
// mutual TLS: writes forwarded between them work, and a peer without a
// certificate from the cluster CA cannot open a Raft connection.
func TestClusterMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "cluster")
	e := newHoldEngine(t, 0)
	e2 := newHoldEngine(t, 0)
	nodes := startCluster(t, 3, func(i int, c *Config) {
		*c = testConfig([]string{e.srv.URL})
		c.Admin.Token = "tok"
		cert, key := ca.issue(t, dir, fmt.Sprintf("router-%d", i))
		c.TLS.ClusterCertFile, c.TLS.ClusterKeyFile, c.TLS.ClusterCAFile = cert, key, ca.file
	})
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	var follower *Node
	for _, n := range nodes {
		if !n.agree.IsLeader() {
			follower = n
		}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}}}
	req, _ := http.NewRequest("POST", "https://"+follower.AdminAddr().String()+"/v1/backends", strings.NewReader(`{"url":"`+e2.srv.URL+`"}`))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Warmroute-Leader") == "" {
		t.Fatalf("forwarded write over mutual TLS: %d %s", resp.StatusCode, body)
	}
	for _, n := range nodes {
		testkit.WaitFor(t, 5*time.Second, "the new backend everywhere", func() bool { r, _ := n.proxy.Ring(); return r.Len() == 2 })
	}

	// A write that claims to be forwarded, from a client with no router
	// certificate, is refused even with the operator's token: only a
	// router may say it forwarded.
	// Under load an election may be under way: wait for a leader.
	var leaderNode *Node
	testkit.WaitFor(t, 10*time.Second, "a leader", func() bool {
		for _, n := range nodes {
			if n.agree.IsLeader() {
				leaderNode = n
				return true
			}
		}
		return false
	})
	req, _ = http.NewRequest("POST", "https://"+leaderNode.AdminAddr().String()+"/v1/backends/"+e2.id()+"/drain", nil)
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set("X-Warmroute-Forwarded", "router-1")
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an unproven forwarded write: %d %s, want 403", resp.StatusCode, body)
	}

	raftAddr := nodes[0].agree.Addr()
	// No client certificate: the handshake fails.
	if c, err := tls.Dial("tcp", raftAddr, &tls.Config{RootCAs: ca.pool}); err == nil {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("x")); err == nil {
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("a Raft connection without a client certificate was accepted")
			}
		}
		c.Close()
	}
	// A certificate from another CA: refused too.
	other := newTestCA(t, dir, "other")
	cf, kf := other.issue(t, dir, "intruder")
	cert, _ := tls.LoadX509KeyPair(cf, kf)
	if c, err := tls.Dial("tcp", raftAddr, &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}); err == nil {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("x")); err == nil {
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("a Raft connection with a foreign certificate was accepted")
			}
		}
		c.Close()
	}
}

func TestAdminExposureNeedsToken(t *testing.T) {
	cfg := testConfig(nil)
	cfg.AdminListen = "0.0.0.0:0"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "no admin token is set") {
		t.Fatalf("non-loopback admin without a token: %v", err)
	}
	cfg.Admin.Insecure = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("with --admin-insecure: %v", err)
	}
	cfg.Admin.Insecure, cfg.Admin.Token = false, "t"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("with a token: %v", err)
	}
}
