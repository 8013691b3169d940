package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// parseCase is one command line for a flag parser: the settings it
// gives, or an error containing wantErr.
type parseCase[O any] struct {
	args    []string
	want    O
	wantErr string
}

// testParser runs every case through parse.
func testParser[O comparable](t *testing.T, parse func([]string, io.Writer) (O, error), cases []parseCase[O]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got, err := parse(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestTLSParseCACreate(t *testing.T) {
	t.Parallel()
	testParser(t, parseCACreate, []parseCase[caCreateOpts]{
		{args: nil, want: caCreateOpts{dir: ".", days: defaultCADays, name: defaultCAName}},
		{args: []string{"--dir", "d", "--days", "30", "--name", "prod CA"}, want: caCreateOpts{dir: "d", days: 30, name: "prod CA"}},
		{args: []string{"--days=0"}, wantErr: "--days 0"},
		{args: []string{"--days", "36501"}, wantErr: "want 1 to 36500"},
		{args: []string{"--days", "x"}, wantErr: "invalid value"},
		{args: []string{"--name", ""}, wantErr: "printable"},
		{args: []string{"--name", "a\nb"}, wantErr: "printable"},
		{args: []string{"--name", strings.Repeat("n", 65)}, wantErr: "printable"},
		{args: []string{"--dir", ""}, wantErr: "--dir is empty"},
		{args: []string{"stray"}, wantErr: "unexpected arguments"},
		{args: []string{"--nope"}, wantErr: "not defined"},
	})
}

func TestTLSParseCertCreate(t *testing.T) {
	t.Parallel()
	type want struct {
		names, dns, ips []string
		dir, ca, caKey  string
		days            int
		expanded        map[string][]string // router -> DNS SANs
	}
	for _, tc := range []struct {
		args    []string
		want    want
		wantErr string
	}{
		{args: []string{"--name", "r1"}, want: want{names: []string{"r1"}, dir: ".", ca: "warmroute-ca.pem", caKey: "warmroute-ca-key.pem", days: defaultCertDays}},
		{args: []string{"--names", "r1,r2", "--name", "r3", "--dir", "out"},
			want: want{names: []string{"r1", "r2", "r3"}, dir: "out", ca: "out/warmroute-ca.pem", caKey: "out/warmroute-ca-key.pem", days: defaultCertDays}},
		{args: []string{"--name", "r1, r2 ,", "--days", "30"}, want: want{names: []string{"r1", "r2"}, dir: ".", ca: "warmroute-ca.pem", caKey: "warmroute-ca-key.pem", days: 30}},
		{args: []string{"--name", "r1", "--ca", "/ca/root.pem"}, want: want{names: []string{"r1"}, dir: ".", ca: "/ca/root.pem", caKey: "/ca/root-key.pem", days: defaultCertDays}},
		{args: []string{"--name", "r1", "--ca", "/ca/root.crt", "--ca-key", "/ca/root.key"}, want: want{names: []string{"r1"}, dir: ".", ca: "/ca/root.crt", caKey: "/ca/root.key", days: defaultCertDays}},
		{args: []string{"--names", "warmroute-0,warmroute-1", "--dns", "warmroute-peers.warmroute.svc", "--dns", "{name}.warmroute-peers.warmroute.svc,{name}", "--ip", "10.0.0.1,::1"},
			want: want{names: []string{"warmroute-0", "warmroute-1"}, dns: []string{"warmroute-peers.warmroute.svc", "{name}.warmroute-peers.warmroute.svc", "{name}"},
				ips: []string{"10.0.0.1", "::1"}, dir: ".", ca: "warmroute-ca.pem", caKey: "warmroute-ca-key.pem", days: defaultCertDays,
				expanded: map[string][]string{
					"warmroute-0": {"warmroute-peers.warmroute.svc", "warmroute-0.warmroute-peers.warmroute.svc", "warmroute-0"},
					"warmroute-1": {"warmroute-peers.warmroute.svc", "warmroute-1.warmroute-peers.warmroute.svc", "warmroute-1"},
				}}},
		{args: []string{"--name", "R1", "--dns", "Router.Example", "--dns", "router.example"},
			want: want{names: []string{"R1"}, dns: []string{"Router.Example", "router.example"}, dir: ".", ca: "warmroute-ca.pem", caKey: "warmroute-ca-key.pem", days: defaultCertDays,
				expanded: map[string][]string{"R1": {"router.example"}}}},
		{args: nil, wantErr: "--name is required"},
		{args: []string{"--name", ","}, wantErr: "--name is required"},
		{args: []string{"--name", "-r"}, wantErr: "invalid router name"},
		{args: []string{"--name", "r 1"}, wantErr: "invalid router name"},
		{args: []string{"--name", "r1", "--name", "r1"}, wantErr: "given twice"},
		{args: []string{"--name", "warmroute-ca"}, wantErr: "reserved"},
		{args: []string{"--name", "warmroute-ca-key"}, wantErr: "reserved"},
		{args: []string{"--name", "r_1", "--dns", "{name}.svc"}, wantErr: "letters, digits and '-' only"},
		{args: []string{"--name", "r1", "--dns", "{node}.svc"}, wantErr: "only placeholder"},
		{args: []string{"--name", "r1", "--dns", "*.svc"}, wantErr: "letters, digits"},
		{args: []string{"--name", "r1", "--dns", "a..b"}, wantErr: "want 1-63"},
		{args: []string{"--name", "r1", "--dns", "-a.b"}, wantErr: "starts or ends"},
		{args: []string{"--name", "r1", "--dns", "a.b."}, wantErr: "want 1-63"},
		{args: []string{"--name", "r1", "--dns", strings.Repeat("a", 64)}, wantErr: "want 1-63"},
		{args: []string{"--name", "r1", "--dns", strings.Repeat("a.", 127) + "a"}, wantErr: "1-253"},
		{args: []string{"--name", "r1", "--ip", "10.0.0.256"}, wantErr: "not a usable IP"},
		{args: []string{"--name", "r1", "--ip", "0.0.0.0"}, wantErr: "not a usable IP"},
		{args: []string{"--name", "r1", "--days", "0"}, wantErr: "--days 0"},
		{args: []string{"--name", "r1", "--dir", ""}, wantErr: "--dir is empty"},
		{args: []string{"--name", "r1", "--ca", "ca.crt"}, wantErr: "give --ca-key too"},
		{args: []string{"r1"}, wantErr: "router names go in --name"},
		{args: []string{"--name", "r1", "--", "x"}, wantErr: "unexpected arguments"},
		{args: []string{"--names", strings.TrimSuffix(strings.Repeat("r,", maxCertNames+1), ",")}, wantErr: "at most 1000"},
		{args: []string{"--name", "r1", "--dns", strings.TrimSuffix(strings.Repeat("a,", maxSANs+1), ",")}, wantErr: "at most 100"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got, err := parseCertCreate(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ips []string
			for _, ip := range got.ips {
				ips = append(ips, ip.String())
			}
			w := tc.want
			if !slices.Equal(got.names, w.names) || !slices.Equal(got.dns, w.dns) || !slices.Equal(ips, w.ips) ||
				got.dir != w.dir || got.caFile != filepath.FromSlash(w.ca) || got.caKeyFile != filepath.FromSlash(w.caKey) || got.days != w.days {
				t.Fatalf("got %+v (ips %v), want %+v", got, ips, w)
			}
			reqs, err := got.requests()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range reqs {
				if r.Validity != time.Duration(w.days)*24*time.Hour {
					t.Errorf("%s: validity %v", r.Name, r.Validity)
				}
				if exp, ok := w.expanded[r.Name]; ok && !slices.Equal(r.DNSNames, exp) {
					t.Errorf("%s: DNS SANs %v, want %v", r.Name, r.DNSNames, exp)
				}
			}
		})
	}
}

func TestTLSParseShow(t *testing.T) {
	t.Parallel()
	testParser(t, parseShow, []parseCase[showOpts]{
		{args: []string{"r1.pem"}, want: showOpts{file: "r1.pem"}},
		{args: []string{"r1.pem", "--ca", "ca.pem", "--name", "r1"}, want: showOpts{file: "r1.pem", caFile: "ca.pem", name: "r1"}},
		{args: []string{"--ca=ca.pem", "--", "-odd.pem"}, want: showOpts{file: "-odd.pem", caFile: "ca.pem"}},
		{args: nil, wantErr: "want one certificate file"},
		{args: []string{"a.pem", "b.pem"}, wantErr: "want one certificate file"},
		{args: []string{"a.pem", "--name", "a b"}, wantErr: "invalid router name"},
	})
}

func TestTLSParseRevoke(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args     []string
		unrevoke bool
		names    []string
		serials  []string
		list     bool
		wantErr  string
	}{
		{args: []string{"--name", "r2"}, names: []string{"r2"}},
		{args: []string{"--name", "r2,r3", "--serial", "0A:1B", "--serial", "0x00ff"}, names: []string{"r2", "r3"}, serials: []string{"a1b", "ff"}},
		{args: []string{"--list"}, list: true},
		{args: []string{"--name", "r2"}, unrevoke: true, names: []string{"r2"}},
		{args: nil, wantErr: "give --name, --serial or --cert"},
		{args: []string{"--list", "--name", "r2"}, wantErr: "--list takes no"},
		{args: []string{"--list"}, unrevoke: true, wantErr: "not defined"},
		{args: []string{"--name", "bad name"}, wantErr: "invalid router name"},
		{args: []string{"--serial", "xyz"}, wantErr: "hex digits only"},
		{args: []string{"r2"}, wantErr: "names go in --name"},
		{args: []string{"--name", "r2", "-o", "yaml"}, wantErr: "want table or json"},
		{args: []string{"--name", strings.TrimSuffix(strings.Repeat("r,", maxRevokeArgs+1), ",")}, wantErr: "at most 1000"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			o, _, err := parseRevoke(tc.args, tc.unrevoke, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if exitCode(err) != 2 {
					t.Errorf("exit code %d for a usage error", exitCode(err))
				}
				return
			}
			if err != nil || !slices.Equal(o.names, tc.names) || !slices.Equal(o.serials, tc.serials) || o.list != tc.list {
				t.Fatalf("got %+v, %v", o, err)
			}
		})
	}
}

func TestTLSCommandDispatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		args    []string
		wantErr string // "" : flag.ErrHelp
	}{
		{args: []string{"--help"}},
		{args: []string{"ca", "create", "--help"}},
		{args: []string{"cert", "create", "-h"}},
		{args: []string{"show", "--help"}},
		{args: nil, wantErr: "missing subcommand"},
		{args: []string{"ca"}, wantErr: "missing action"},
		{args: []string{"cert"}, wantErr: "missing action"},
		{args: []string{"ca", "delete"}, wantErr: `unknown subcommand "ca delete"`},
		{args: []string{"rotate"}, wantErr: `unknown subcommand "rotate"`},
		{args: []string{"revoke", "--help"}},
		{args: []string{"unrevoke", "-h"}},
	} {
		var out, errOut bytes.Buffer
		err := cmdTLS(ctx, tc.args, &out, &errOut)
		if tc.wantErr == "" {
			if !errors.Is(err, flag.ErrHelp) || out.Len()+errOut.Len() == 0 {
				t.Errorf("%q: %v, want help text and flag.ErrHelp", tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(errOut.String(), "usage: warmroute tls") {
			t.Errorf("%q: %v (stderr %q), want %q and the usage", tc.args, err, errOut.String(), tc.wantErr)
		}
	}
}

// tlsRun runs 'warmroute tls' in process and returns its stdout.
func tlsRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := cmdTLS(context.Background(), args, &out, io.Discard)
	return out.String(), err
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestTLSCreateCAAndCertificates(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "tls") // created by ca create
	out, err := tlsRun(t, "ca", "create", "--dir", dir, "--days", "100", "--name", "test CA")
	if err != nil {
		t.Fatal(err)
	}
	caFile, caKey := filepath.Join(dir, "warmroute-ca.pem"), filepath.Join(dir, "warmroute-ca-key.pem")
	routerDir := filepath.Join(filepath.Dir(dir), "router-tls")
	for _, want := range []string{"wrote " + caFile, "wrote " + caKey, "keep it offline", "next: ",
		"tls cert create --ca " + caFile + " --dir " + routerDir, "never the key"} {
		if !strings.Contains(out, want) {
			t.Errorf("ca create output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--dir "+dir+" ") {
		t.Errorf("ca create suggests writing router files into the CA directory:\n%s", out)
	}
	if m := mode(t, caKey); m != 0o600 {
		t.Errorf("CA key mode %o, want 600", m)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("new directory mode %o, want 700", m)
	}
	ca, err := identity.LoadCA(caFile, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Cert.Subject.CommonName != "test CA" || ca.Cert.NotAfter.Sub(time.Now()) < 99*24*time.Hour || ca.Cert.NotAfter.Sub(time.Now()) > 101*24*time.Hour {
		t.Errorf("CA %q valid until %v", ca.Cert.Subject.CommonName, ca.Cert.NotAfter)
	}
	if _, err := tlsRun(t, "ca", "create", "--dir", dir); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second ca create: %v", err)
	}

	out, err = tlsRun(t, "cert", "create", "--dir", dir, "--names", "r1,r2", "--name", "r3",
		"--dns", "{name}", "--dns", "peers.example", "--ip", "127.0.0.1", "--days", "30")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"wrote " + filepath.Join(dir, "r3.pem"), "--node-name r1 --cluster-tls-cert-file " + filepath.Join(dir, "r1.pem"), "warmroute tls show",
		"also holds the CA key"} {
		if !strings.Contains(out, want) {
			t.Errorf("cert create output lacks %q:\n%s", want, out)
		}
	}
	for _, n := range []string{"r1", "r2", "r3"} {
		cert, key := filepath.Join(dir, n+".pem"), filepath.Join(dir, n+"-key.pem")
		if m := mode(t, key); m != 0o600 {
			t.Errorf("%s: key mode %o", n, m)
		}
		b, err := identity.Load(cert, key, caFile)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		leaf := b.Cert.Leaf
		if b.Name != n || !slices.Equal(leaf.DNSNames, []string{n, "peers.example"}) || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
			t.Errorf("%s: name %q DNS %v IPs %v", n, b.Name, leaf.DNSNames, leaf.IPAddresses)
		}
		if d := time.Until(leaf.NotAfter); d < 29*24*time.Hour || d > 31*24*time.Hour {
			t.Errorf("%s: valid until %v", n, leaf.NotAfter)
		}
	}

	// All or nothing: r4 is not written when r1 exists.
	if _, err := tlsRun(t, "cert", "create", "--dir", dir, "--names", "r4,r1"); err == nil || !strings.Contains(err.Error(), "r1.pem") {
		t.Fatalf("overwrite: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "r4.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("r4.pem written although r1 existed: %v", err)
	}
	// A certificate longer than the CA is cut to the CA's end, and said so.
	out, err = tlsRun(t, "cert", "create", "--dir", dir, "--name", "r5", "--days", "1000")
	if err != nil || !strings.Contains(out, "the CA expires on") {
		t.Fatalf("capped certificate: %v\n%s", err, out)
	}
	// The CA elsewhere, named with --ca (its key found beside it): no
	// note about the CA key.
	other := t.TempDir()
	if out, err := tlsRun(t, "cert", "create", "--dir", other, "--name", "r6", "--ca", caFile); err != nil || strings.Contains(out, "CA key") {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := identity.Load(filepath.Join(other, "r6.pem"), filepath.Join(other, "r6-key.pem"), caFile); err != nil {
		t.Fatal(err)
	}
	// No CA: the error says how to make one.
	if _, err := tlsRun(t, "cert", "create", "--dir", t.TempDir(), "--name", "r7"); err == nil || !strings.Contains(err.Error(), "warmroute tls ca create") {
		t.Fatalf("missing CA: %v", err)
	}
	// A CA key that is not the CA's.
	if _, err := tlsRun(t, "cert", "create", "--dir", other, "--name", "r8", "--ca", caFile, "--ca-key", filepath.Join(dir, "r1-key.pem")); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Fatalf("wrong CA key: %v", err)
	}
}

func TestTLSCertCreateRefusesExpiredCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, err := identity.NewCA("old", -time.Minute) // expired a minute ago
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := ca.KeyPEM()
	os.WriteFile(filepath.Join(dir, "warmroute-ca.pem"), ca.CertPEM(), 0o644)
	os.WriteFile(filepath.Join(dir, "warmroute-ca-key.pem"), kp, 0o600)
	if _, err := tlsRun(t, "cert", "create", "--dir", dir, "--name", "r1"); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired CA: %v", err)
	}
}

func TestTLSWriteNewFilesAllOrNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	err := writeNewFiles(dir, []newFile{
		{filepath.Join(dir, "a.pem"), []byte("a"), 0o600},
		{filepath.Join(dir, "missing", "b.pem"), []byte("b"), 0o600},
	})
	if err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "a.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a.pem left behind: %v", err)
	}
	// A dangling symlink counts as existing: nothing is written through it.
	link := filepath.Join(dir, "link.pem")
	if err := os.Symlink(filepath.Join(dir, "elsewhere"), link); err != nil {
		t.Skip(err)
	}
	if err := refuseExisting(link); err == nil {
		t.Fatal("dangling symlink not refused")
	}
	if err := writeNew(newFile{link, []byte("x"), 0o600}); err == nil {
		t.Fatal("wrote through a symlink")
	}
	if _, err := os.Stat(filepath.Join(dir, "elsewhere")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("symlink target created")
	}
}

// signCert makes a P-256 key and a certificate from tmpl (serial number
// and validity filled in when unset) signed by ca, or by itself when ca is
// nil, and returns the certificate (DER) and the key.
func signCert(t *testing.T, tmpl *x509.Certificate, ca *identity.CA) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber == nil {
		tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	}
	parent, parentKey := tmpl, any(k)
	if ca != nil {
		parent, parentKey = ca.Cert, ca.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &k.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, k
}

// rawCert makes a self-signed certificate from tmpl (no URI SAN, odd
// subjects) for the show tests, in PEM.
func rawCert(t *testing.T, tmpl *x509.Certificate) []byte {
	t.Helper()
	der, _ := signCert(t, tmpl, nil)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestTLSShow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := tlsRun(t, "ca", "create", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsRun(t, "cert", "create", "--dir", dir, "--name", "router-a", "--dns", "{name}"); err != nil {
		t.Fatal(err)
	}
	otherCA := t.TempDir()
	if _, err := tlsRun(t, "ca", "create", "--dir", otherCA); err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	routerPEM, _ := os.ReadFile(filepath.Join(dir, "router-a.pem"))
	caPEM, _ := os.ReadFile(filepath.Join(dir, "warmroute-ca.pem"))
	keyPEM, _ := os.ReadFile(filepath.Join(dir, "router-a-key.pem"))
	plain := write("plain.pem", rawCert(t, &x509.Certificate{Subject: pkix.Name{CommonName: "www"}, DNSNames: []string{"www.example"}}))
	twoNames := write("two.pem", rawCert(t, &x509.Certificate{Subject: pkix.Name{CommonName: "x"},
		URIs: []*url.URL{identity.URI("a"), identity.URI("b")}}))
	hostile := write("hostile.pem", rawCert(t, &x509.Certificate{Subject: pkix.Name{CommonName: "evil\x1b[2J\r\nrouter: r1"},
		DNSNames: []string{"bad\x07name"}}))
	expired := write("expired.pem", rawCert(t, &x509.Certificate{Subject: pkix.Name{CommonName: "old"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}))
	bundle := write("bundle.pem", slices.Concat(routerPEM, keyPEM, caPEM))

	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		notWant []string
		wantErr string
	}{
		{name: "router", args: []string{filepath.Join(dir, "router-a.pem")},
			want: []string{"router:    router-a\n", "subject:   CN=router-a,O=warmroute", "issuer:    CN=warmroute cluster CA", "URIs:      urn:warmroute:router:router-a",
				"DNS names: router-a\n", "IPs:       -", "days left", "usage:     server, client", "sha256:    "}},
		{name: "router checked", args: []string{filepath.Join(dir, "router-a.pem"), "--ca", filepath.Join(dir, "warmroute-ca.pem"), "--name", "router-a"},
			want: []string{"check:     signed by the CA"}},
		{name: "other CA", args: []string{"--ca", filepath.Join(otherCA, "warmroute-ca.pem"), filepath.Join(dir, "router-a.pem")},
			want: []string{"router:    router-a"}, wantErr: "not valid under the CA"},
		{name: "wrong name", args: []string{"--name", "router-b", filepath.Join(dir, "router-a.pem")}, wantErr: `proves router "router-a", want "router-b"`},
		{name: "CA", args: []string{filepath.Join(dir, "warmroute-ca.pem")}, want: []string{"router:    none (a CA certificate)", "CA:        yes"}},
		{name: "no router name", args: []string{plain}, want: []string{"router:    none: this certificate names no warmroute router", "DNS names: www.example"}},
		{name: "no router name checked", args: []string{"--name", "www", plain}, wantErr: "proves no router name"},
		{name: "two router names", args: []string{twoNames}, want: []string{"router:    none: this certificate names no warmroute router"}},
		{name: "hostile", args: []string{hostile}, want: []string{`evil\x1b[2J\r\nrouter: r1`, `bad\aname`}, notWant: []string{"\x1b", "\r", "\x07"}},
		{name: "expired", args: []string{expired}, want: []string{"(EXPIRED)"}},
		{name: "expired checked", args: []string{"--ca", expired, expired}, wantErr: "expired"},
		{name: "bundle", args: []string{bundle}, want: []string{"certificate 1 of 2", "certificate 2 of 2", "also holds 1 private key(s), not shown"}, notWant: []string{"PRIVATE KEY"}},
		{name: "key file", args: []string{filepath.Join(dir, "router-a-key.pem")}, wantErr: "holds a private key, not a certificate"},
		{name: "empty", args: []string{write("empty.pem", nil)}, wantErr: "no PEM certificate"},
		{name: "garbage", args: []string{write("garbage.pem", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))}, wantErr: "certificate 1:"},
		{name: "huge", args: []string{write("huge.pem", make([]byte, maxShowBytes+1))}, wantErr: "larger than"},
		{name: "missing", args: []string{filepath.Join(dir, "nope.pem")}, wantErr: "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tlsRun(t, append([]string{"show"}, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q\n%s", err, tc.wantErr, out)
				}
			} else if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output contains %q:\n%s", w, out)
				}
			}
		})
	}
}

// FuzzTLSCertCreateArgs: 'tls cert create' flag parsing never panics, and
// whatever it accepts is a set of valid, distinct router names with host
// names and addresses a certificate can carry.
func FuzzTLSCertCreateArgs(f *testing.F) {
	f.Add("--name\x00r1")
	f.Add("--names\x00r1,r2,r3\x00--dns\x00{name}\x00--ip\x00127.0.0.1\x00--dir\x00out")
	f.Add("--name\x00warmroute-0\x00--dns\x00{name}.warmroute-peers.warmroute.svc,warmroute-peers.warmroute.svc\x00--days\x00730")
	f.Add("--name\x00r1\x00--ca\x00/x/ca.pem\x00--ca-key\x00/x/k.pem")
	f.Add("--name\x00r_1\x00--dns\x00{name}")
	f.Add("--name\x00r1\x00--dns\x00{{name}}\x00--ip\x00::ffff:1.2.3.4")
	f.Add("r1\x00--\x00--name")
	f.Fuzz(func(t *testing.T, args string) {
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\x00")
		}
		o, err := parseCertCreate(argv, io.Discard)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if len(o.names) == 0 || len(o.names) > maxCertNames || o.days < 1 || o.days > maxDays || o.caFile == "" || o.caKeyFile == "" {
			t.Fatalf("accepted %q: %+v", argv, o)
		}
		reqs, err := o.requests()
		if err != nil {
			t.Fatalf("accepted %q but requests fail: %v", argv, err)
		}
		seen := map[string]bool{}
		for _, r := range reqs {
			if err := identity.CheckName(r.Name); err != nil || seen[r.Name] {
				t.Fatalf("accepted name %q (%v, seen %v)", r.Name, err, seen[r.Name])
			}
			seen[r.Name] = true
			if filepath.Base(o.certFile(r.Name)) != r.Name+".pem" {
				t.Fatalf("name %q escapes the directory", r.Name)
			}
			if len(r.DNSNames) > maxSANs || len(r.IPs) > maxSANs {
				t.Fatalf("%d DNS names, %d IPs", len(r.DNSNames), len(r.IPs))
			}
			for _, d := range r.DNSNames {
				if checkHostName(d) != nil || d != strings.ToLower(d) {
					t.Fatalf("accepted DNS name %q", d)
				}
			}
			for _, ip := range r.IPs {
				if ip == nil || ip.IsUnspecified() {
					t.Fatalf("accepted IP %v", ip)
				}
			}
		}
	})
}

// FuzzTLSShowPEM: 'tls show' reads any file without panicking and never
// prints a control character from it.
func FuzzTLSShowPEM(f *testing.F) {
	ca, err := identity.NewCA("fuzz CA", time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	c, k, err := ca.Issue(identity.Request{Name: "r1", DNSNames: []string{"r1"}, Validity: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(c)
	f.Add(slices.Concat(c, k, ca.CertPEM()))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, _, err := parseCertsPEM(data)
		if err != nil {
			return
		}
		if len(certs) > maxShowCerts {
			t.Fatalf("%d certificates", len(certs))
		}
		var out bytes.Buffer
		for _, c := range certs {
			describeCert(&out, c, time.Now())
		}
		for _, r := range out.String() {
			if r != '\n' && notPrintable(r) {
				t.Fatalf("printed %U:\n%q", r, out.String())
			}
		}
	})
}

// TestE2ETLSCommands runs 'warmroute tls' as a binary: files, modes, exit
// codes and messages.
func TestE2ETLSCommands(t *testing.T) {
	t.Parallel()
	needBinary(t)
	dir := t.TempDir()
	out, err := runCLI(t, "tls", "ca", "create", "--dir", dir)
	if err != nil || !strings.Contains(out, "warmroute-ca-key.pem") {
		t.Fatalf("ca create: %v\n%s", err, out)
	}
	out, err = runCLI(t, "tls", "cert", "create", "--dir", dir, "--names", "r0,r1,r2")
	if err != nil || !strings.Contains(out, "next: start the router") {
		t.Fatalf("cert create: %v\n%s", err, out)
	}
	out, err = runCLI(t, "tls", "cert", "create", "--dir", dir, "--name", "r1")
	if err == nil || !strings.Contains(out, "refusing to overwrite") {
		t.Fatalf("overwrite: %v\n%s", err, out)
	}
	out, err = runCLI(t, "tls", "cert", "create", "--dir", dir, "--name", "bad name")
	if err == nil || !strings.Contains(out, "invalid router name") {
		t.Fatalf("bad name: %v\n%s", err, out)
	}
	out, err = runCLI(t, "tls", "show", "--ca", filepath.Join(dir, "warmroute-ca.pem"), "--name", "r2", filepath.Join(dir, "r2.pem"))
	if err != nil || !strings.Contains(out, "router:    r2") {
		t.Fatalf("show: %v\n%s", err, out)
	}
	out, err = runCLI(t, "tls", "show", "--name", "r1", filepath.Join(dir, "r2.pem"))
	if err == nil || !strings.Contains(out, `want "r1"`) {
		t.Fatalf("show with the wrong name: %v\n%s", err, out)
	}
	out, err = runCLI(t, "tls", "--help")
	if err != nil || !strings.Contains(out, "warmroute tls cert create") {
		t.Fatalf("help: %v\n%s", err, out)
	}
	out, err = runCLI(t, "help")
	if err != nil || !strings.Contains(out, "tls ") {
		t.Fatalf("the command list lacks tls: %v\n%s", err, out)
	}
}

// TestE2ETLSCluster: three routers with certificates from 'warmroute tls'
// run Raft and the admin API over mutual TLS, agree on a leader, and the
// CLI reads the cluster over HTTPS with --ca-file.
func TestE2ETLSCluster(t *testing.T) {
	t.Parallel()
	needCluster(t)
	dir := t.TempDir()
	if out, err := runCLI(t, "tls", "ca", "create", "--dir", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := runCLI(t, "tls", "cert", "create", "--dir", dir, "--names", "r0,r1,r2", "--ip", "127.0.0.1"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	caFile := filepath.Join(dir, "warmroute-ca.pem")
	e := newEngine(t, 0, 0, 1)
	ps := spawnCluster(t, 3, proc.ServeArgs{Backends: []string{e.srv.URL}}, func(_ int, a *proc.ServeArgs) {
		a.ClusterTLS = proc.ClusterTLS{CertFile: filepath.Join(dir, a.NodeName+".pem"), KeyFile: filepath.Join(dir, a.NodeName+"-key.pem"), CAFile: caFile}
	})
	tc, err := caOnlyTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()
	waitAgreed(t, hc, ps, 60*time.Second)
	// The admin listener speaks TLS only, with the router's certificate.
	adminAddr := strings.TrimPrefix(ps[1].admin, "https://")
	if resp, err := http.Get("http://" + adminAddr + "/v1/cluster"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("the admin API answered plain HTTP")
		}
	}
	conn, err := tls.Dial("tcp", adminAddr, tc)
	if err != nil {
		t.Fatal(err)
	}
	name, err := identity.PeerName(conn.ConnectionState())
	conn.Close()
	if err != nil || name != "r1" {
		t.Fatalf("router r1's admin listener proves %q (%v)", name, err)
	}
	// A write through any router (a follower forwards it to the leader over
	// mutual TLS).
	out, err := runCLI(t, "config", "--admin", ps[2].admin, "--ca-file", caFile, "set", "prefix_length=2048")
	if err != nil {
		t.Fatalf("config set over HTTPS: %v\n%s", err, out)
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &cfg); err != nil {
		t.Fatalf("config set answer: %v\n%s", err, out)
	}
	out, err = runCLI(t, "status", "--admin", ps[0].admin, "--ca-file", caFile)
	if err != nil || !strings.Contains(out, "r2") {
		t.Fatalf("status over HTTPS: %v\n%s", err, out)
	}
	// Without the CA the CLI refuses the routers' certificate.
	out, err = runCLI(t, "status", "--admin", ps[0].admin)
	if err == nil {
		t.Fatalf("status without --ca-file trusted the cluster certificate:\n%s", out)
	}
}
