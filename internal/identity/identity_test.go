package identity

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"r1", "router-a", "warmroute-0", "a.b_c-d", "R", strings.Repeat("x", MaxNameLen)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-r", ".r", "r 1", "r\n1", "r\x001", "r/1", "r,1", "ü", strings.Repeat("x", MaxNameLen+1)} {
		if err := CheckName(bad); !errors.Is(err, ErrBadName) {
			t.Errorf("CheckName(%q) = %v, want ErrBadName", bad, err)
		}
	}
}

// writeRouter issues a router certificate into dir and returns its files.
func writeRouter(t *testing.T, ca *CA, dir, name string) (certFile, keyFile string) {
	t.Helper()
	c, k, err := ca.Issue(Request{Name: name, Validity: time.Hour, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func writeCA(t *testing.T, dir, name string) (*CA, string) {
	t.Helper()
	ca, err := NewCA(name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(f, ca.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	kp, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-key.pem"), kp, 0o600); err != nil {
		t.Fatal(err)
	}
	return ca, f
}

func TestIssueLoadVerify(t *testing.T) {
	dir := t.TempDir()
	ca, caFile := writeCA(t, dir, "ca")
	cert, key := writeRouter(t, ca, dir, "r1")
	b, err := Load(cert, key, caFile)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name != "r1" {
		t.Fatalf("name %q, want r1", b.Name)
	}
	// The CA round-trips through its files.
	ca2, err := LoadCA(caFile, filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert2, key2 := writeRouter(t, ca2, dir, "r2")
	b2, err := Load(cert2, key2, caFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, name, err := b.VerifyChain(b2.Chain(), UsageRouter); err != nil || name != "r2" {
		t.Fatalf("VerifyChain = %q, %v", name, err)
	}

	// Another CA's router is not trusted, and a CA key that does not
	// match its certificate is refused.
	other, _ := writeCA(t, dir, "other")
	oc, ok := writeRouter(t, other, dir, "r1x")
	if _, err := Load(oc, ok, caFile); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("foreign certificate: %v, want ErrUntrusted", err)
	}
	if _, err := LoadCA(caFile, filepath.Join(dir, "other-key.pem")); err == nil {
		t.Fatal("LoadCA accepted a key of another CA")
	}
}

// plainCert is a CA-signed certificate with a common name but no router
// URI, or with the given URIs.
func plainCert(t *testing.T, ca *CA, cn string, uris ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestNameOnlyFromRouterURI(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cases := []struct {
		uris []string
		want error
	}{
		{nil, ErrNoName}, // a common name alone names nobody
		{[]string{"spiffe://example.org/r1"}, ErrNoName},
		{[]string{URNPrefix + "r1", URNPrefix + "r2"}, ErrNoName},
		{[]string{URNPrefix + "r%0A1"}, ErrBadName},
		{[]string{URNPrefix + "r1"}, nil},
	}
	for _, c := range cases {
		_, err := NewBundle(plainCert(t, ca, "r1", c.uris...), roots)
		if !errors.Is(err, c.want) && !(c.want == nil && err == nil) {
			t.Errorf("URIs %v: %v, want %v", c.uris, err, c.want)
		}
	}
}

// handshake runs a TLS handshake over loopback TCP (buffered, unlike
// net.Pipe, so both sides may write an alert at once) and returns both
// errors.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error, serverState tls.ConnectionState) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	sc := tls.Server(a, server)
	go func() {
		err := sc.Handshake()
		if err != nil {
			a.Close()
		}
		done <- err
	}()
	cc := tls.Client(b, client)
	cerr := cc.Handshake()
	if cerr != nil {
		b.Close()
	} else {
		// In TLS 1.3 the client is done before the server has checked
		// its certificate: read the server's alert, if any, so that
		// the pipe does not block the server's write of it.
		go func() { _, _ = io.Copy(io.Discard, cc) }()
	}
	serr := <-done
	a.Close()
	return serr, cerr, sc.ConnectionState()
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caFile := writeCA(t, dir, "ca")
	load := func(name string) *Bundle {
		c, k := writeRouter(t, ca, dir, name)
		b, err := Load(c, k, caFile)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	r1, r2 := load("r1"), load("r2")

	serr, cerr, st := handshake(t, r1.ServerConfig(false), r2.ClientConfig(ExpectName("r1")))
	if serr != nil || cerr != nil {
		t.Fatalf("handshake: server %v, client %v", serr, cerr)
	}
	if name, err := PeerName(st); err != nil || name != "r2" {
		t.Fatalf("PeerName = %q, %v", name, err)
	}

	// The client expects another router at that address: refused.
	if _, cerr, _ := handshake(t, r1.ServerConfig(false), r2.ClientConfig(ExpectName("r3"))); !errors.Is(cerr, ErrWrongPeer) {
		t.Fatalf("wrong server name: %v, want ErrWrongPeer", cerr)
	}
	// A client without a certificate is refused where one is required,
	// and let in where it is optional.
	anon := &tls.Config{InsecureSkipVerify: true}
	if serr, _, _ := handshake(t, r1.ServerConfig(false), anon); serr == nil {
		t.Fatal("a client without a certificate passed a required client certificate")
	}
	if serr, cerr, _ := handshake(t, r1.ServerConfig(true), anon); serr != nil || cerr != nil {
		t.Fatalf("optional client certificate: server %v, client %v", serr, cerr)
	}
	// A certificate of another CA is refused, also where it is optional.
	other, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign := plainCert(t, other, "r1", URNPrefix+"r1")
	fc := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{foreign}}
	if serr, _, _ := handshake(t, r1.ServerConfig(true), fc); !errors.Is(serr, ErrUntrusted) {
		t.Fatalf("foreign client certificate: %v, want ErrUntrusted", serr)
	}
}

func TestSignVerify(t *testing.T) {
	msg := []byte("figures")
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	ed, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, pair := range map[string]struct {
		pub  any
		priv any
	}{"ed25519": {ed, edPriv}, "rsa": {&rk.PublicKey, rk}, "ecdsa": {&ek.PublicKey, ek}} {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			URIs: []*url.URL{URI("r-" + name)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pair.pub, ca.Key)
		if err != nil {
			t.Fatal(name, err)
		}
		b, err := NewBundle(tls.Certificate{Certificate: [][]byte{der}, PrivateKey: pair.priv}, roots)
		if err != nil {
			t.Fatal(name, err)
		}
		sig, err := b.Sign(msg)
		if err != nil {
			t.Fatal(name, err)
		}
		got, verify, notAfter, err := b.Verifier(b.Chain())
		if err != nil || got != "r-"+name || notAfter.IsZero() {
			t.Fatalf("%s: Verifier = %q, %v, %v", name, got, notAfter, err)
		}
		if !verify(msg, sig) {
			t.Errorf("%s: a good signature failed", name)
		}
		if verify([]byte("figureS"), sig) {
			t.Errorf("%s: a signature verified another message", name)
		}
		bad := append([]byte(nil), sig...)
		bad[len(bad)/2] ^= 1
		if verify(msg, bad) {
			t.Errorf("%s: a damaged signature verified", name)
		}
	}
}

func TestExpiredCertificateRefused(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(3), NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
		URIs: []*url.URL{URI("old")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewBundle(tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, roots); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("expired certificate: %v, want ErrUntrusted", err)
	}
}

func TestParseKeyPEM(t *testing.T) {
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalECPrivateKey(ek)
	p8, _ := x509.MarshalPKCS8PrivateKey(ek)
	for typ, der := range map[string][]byte{"EC PRIVATE KEY": ecDER, "PRIVATE KEY": p8} {
		k, err := ParseKeyPEM(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
		if err != nil || !publicKeysEqual(k.Public(), &ek.PublicKey) {
			t.Errorf("%s: %v", typ, err)
		}
	}
	for _, bad := range []string{"", "not pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"} {
		if _, err := ParseKeyPEM([]byte(bad)); err == nil {
			t.Errorf("ParseKeyPEM(%q) accepted", bad)
		}
	}
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"r1", "router-a", "", "-x", "a\x00", "ü", strings.Repeat("a", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := CheckName(name)
		if err != nil {
			return
		}
		// A valid name survives the URI round trip unchanged.
		u, perr := url.Parse(URI(name).String())
		if perr != nil || strings.TrimPrefix(u.String(), URNPrefix) != name {
			t.Fatalf("name %q does not round-trip through its URI: %v", name, perr)
		}
		for i := 0; i < len(name); i++ {
			if name[i] < '!' || name[i] > '~' || name[i] == ',' || name[i] == '/' {
				t.Fatalf("CheckName accepted %q", name)
			}
		}
	})
}

func FuzzParseKeyPEM(f *testing.F) {
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p8, _ := x509.MarshalPKCS8PrivateKey(ek)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\n\n-----END EC PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKeyPEM(b)
		if err == nil && k == nil {
			t.Fatal("nil key without an error")
		}
	})
}

// usageCert is a CA-signed router certificate for name with the given
// extended key usages (none: the extension is left out).
func usageCert(t *testing.T, ca *CA, name string, serial int64, usages ...x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{URI(name)}, ExtKeyUsage: usages}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestKeyUsageChecked: a certificate of the cluster CA that names a
// router but was issued for something else (code signing, or only one
// direction of TLS) passed as that router before. Now each check asks
// for the usage it needs: server auth of a server, client auth of a
// client, both for a signature and for this router's own certificate.
func TestKeyUsageChecked(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	r1, err := ca.Bundle(Request{Name: "r1", Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	server, client := x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth
	for _, c := range []struct {
		name                         string
		usages                       []x509.ExtKeyUsage
		asServer, asClient, asRouter bool
	}{
		{"both", []x509.ExtKeyUsage{server, client}, true, true, true},
		{"code signing", []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}, false, false, false},
		{"no usage listed", nil, false, false, false},
		{"any", []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, false, false, false},
		{"server only", []x509.ExtKeyUsage{server}, true, false, false},
		{"client only", []x509.ExtKeyUsage{client}, false, true, false},
	} {
		cert := usageCert(t, ca, "r2", 42, c.usages...)
		for _, u := range []struct {
			usage Usage
			want  bool
		}{{UsageServer, c.asServer}, {UsageClient, c.asClient}, {UsageRouter, c.asRouter}} {
			_, name, err := r1.VerifyChain(cert.Certificate, u.usage)
			if u.want && (err != nil || name != "r2") {
				t.Errorf("%s as %v: %q, %v; want r2", c.name, u.usage, name, err)
			}
			if !u.want && !errors.Is(err, ErrKeyUsage) {
				t.Errorf("%s as %v: %q, %v; want ErrKeyUsage", c.name, u.usage, name, err)
			}
		}
		// The same through TLS: r1 dials a server presenting it, and a
		// client presenting it dials r1.
		srv := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert}
		if _, cerr, _ := handshake(t, srv, r1.ClientConfig(ExpectName("r2"))); (cerr == nil) != c.asServer {
			t.Errorf("%s serving r1: %v", c.name, cerr)
		}
		cl := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}
		if serr, _, _ := handshake(t, r1.ServerConfig(false), cl); (serr == nil) != c.asClient {
			t.Errorf("%s dialling r1: %v", c.name, serr)
		}
		if _, _, _, err := r1.Verifier(cert.Certificate); (err == nil) != c.asRouter {
			t.Errorf("%s signing: %v", c.name, err)
		}
		if _, err := NewBundle(cert, roots); (err == nil) != c.asRouter {
			t.Errorf("%s as this router's own certificate: %v", c.name, err)
		}
	}
}

// TestRevocations: a name or a serial number on the list refuses the
// certificate in every check, also a signature function handed out
// before the revocation; taking it off the list restores it.
func TestRevocations(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := ca.Bundle(Request{Name: "r1", Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ca.Bundle(Request{Name: "r2", Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	serial := Serial(r2.Cert.Leaf)
	sig, err := r2.Sign([]byte("m"))
	if err != nil {
		t.Fatal(err)
	}
	_, verify, _, err := r1.Verifier(r2.Chain())
	if err != nil || !verify([]byte("m"), sig) {
		t.Fatalf("before revocation: %v", err)
	}
	colons := ""
	for i := 0; i < len(serial); i += 2 {
		colons += strings.ToUpper(serial[i:min(i+2, len(serial))]) + ":"
	}
	for _, list := range []struct {
		names, serials []string
	}{{[]string{"r2"}, nil}, {nil, []string{serial}}} {
		r1.Revocations().Set(list.names, list.serials)
		if _, _, err := r1.VerifyChain(r2.Chain(), UsageRouter); !errors.Is(err, ErrRevoked) {
			t.Errorf("%v: VerifyChain %v, want ErrRevoked", list, err)
		}
		if verify([]byte("m"), sig) {
			t.Errorf("%v: a signature function from before the revocation still verifies", list)
		}
		if serr, _, _ := handshake(t, r1.ServerConfig(false), r2.ClientConfig(ExpectName("r1"))); !errors.Is(serr, ErrRevoked) {
			t.Errorf("%v: handshake %v, want ErrRevoked", list, serr)
		}
		r1.Revocations().Set(nil, nil)
		serr, _, st := handshake(t, r1.ServerConfig(false), r2.ClientConfig(ExpectName("r1")))
		if serr != nil {
			t.Fatalf("after the list emptied: %v", serr)
		}
		r1.Revocations().Set(list.names, list.serials)
		if _, err := r1.CheckPeer(st); !errors.Is(err, ErrRevoked) {
			t.Errorf("%v: CheckPeer of a connection made before the revocation: %v", list, err)
		}
		r1.Revocations().Set(nil, nil)
		if !verify([]byte("m"), sig) {
			t.Errorf("%v: not restored", list)
		}
	}
	// Serial numbers as operators write them.
	for in, want := range map[string]string{
		serial: serial, strings.TrimSuffix(colons, ":"): serial, "0x" + strings.ToUpper(serial): serial, "00" + serial: serial, "0": "0",
	} {
		if got, err := CanonicalSerial(in); err != nil || got != want {
			t.Errorf("CanonicalSerial(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "xyz", "12 34", "-1", strings.Repeat("f", MaxSerialHex+1), "0x"} {
		if got, err := CanonicalSerial(bad); err == nil {
			t.Errorf("CanonicalSerial(%q) = %q, want an error", bad, got)
		}
	}
}
