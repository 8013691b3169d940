package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// URNPrefix starts the URI SAN that names a router.
const URNPrefix = "urn:warmroute:router:"

// MaxNameLen bounds a router name.
const MaxNameLen = 128

// Errors, matched with errors.Is.
var (
	// ErrNoName: the certificate carries no urn:warmroute:router: URI, or
	// more than one.
	ErrNoName = errors.New("identity: the certificate names no warmroute router (want one URI SAN " + URNPrefix + "<name>)")
	// ErrBadName: a router name with characters outside [A-Za-z0-9._-],
	// empty, or too long.
	ErrBadName = errors.New("identity: invalid router name")
	// ErrUntrusted: the certificate chain does not lead to the cluster CA.
	ErrUntrusted = errors.New("identity: certificate not signed by the cluster CA")
	// ErrWrongPeer: the peer proved another router name than expected.
	ErrWrongPeer = errors.New("identity: peer is not the expected router")
	// ErrKeyUsage: the certificate was not issued for what it is used
	// for (a code-signing certificate presented by a TLS server, say).
	ErrKeyUsage = errors.New("identity: certificate not issued for this use")
	// ErrRevoked: the certificate's router name or serial number is on
	// the cluster's revocation list.
	ErrRevoked = errors.New("identity: certificate revoked")
)

// Usage is what a peer's certificate must have been issued for: its
// extended key usages. Router certificates from Issue carry both.
type Usage uint8

const (
	// UsageServer: TLS server authentication, checked in a certificate
	// that serves (a router this one dials).
	UsageServer Usage = 1 << iota
	// UsageClient: TLS client authentication, checked in a certificate
	// that dials (a router connecting to this one's listener).
	UsageClient
	// UsageRouter: both, checked where a certificate proves a router
	// without a TLS connection to tell the direction (gossip
	// signatures, this router's own certificate).
	UsageRouter = UsageServer | UsageClient
)

// extKeyUsages lists the extended key usages u needs.
func (u Usage) extKeyUsages() []x509.ExtKeyUsage {
	var out []x509.ExtKeyUsage
	if u&UsageServer != 0 {
		out = append(out, x509.ExtKeyUsageServerAuth)
	}
	if u&UsageClient != 0 {
		out = append(out, x509.ExtKeyUsageClientAuth)
	}
	return out
}

func (u Usage) String() string {
	switch u {
	case UsageServer:
		return "TLS server authentication"
	case UsageClient:
		return "TLS client authentication"
	}
	return "TLS server and client authentication"
}

// checkUsage reports whether the leaf lists every extended key usage u
// needs. A certificate that lists none is refused too (RFC 5280 lets it
// serve any purpose; a router certificate says what it is for).
func checkUsage(leaf *x509.Certificate, u Usage) error {
	for _, want := range u.extKeyUsages() {
		if !slices.Contains(leaf.ExtKeyUsage, want) {
			return fmt.Errorf("%w: it is not issued for %s (warmroute tls cert create makes certificates for both server and client authentication)", ErrKeyUsage, u)
		}
	}
	return nil
}

// CheckName reports whether name can name a router: 1-128 characters of
// letters, digits, '.', '_' and '-', starting with a letter or digit.
// Names appear in logs, metrics labels and HTTP headers, so no control
// characters, spaces or separators are allowed.
func CheckName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w %q: 1-%d characters", ErrBadName, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return fmt.Errorf("%w %q: letters, digits, '.', '_' and '-' only, starting with a letter or digit", ErrBadName, name)
		}
	}
	return nil
}

// URI is the SAN that names router name.
func URI(name string) *url.URL {
	u, _ := url.Parse(URNPrefix + name)
	return u
}

// NameOf returns the router name c proves: its one urn:warmroute:router:
// URI SAN.
func NameOf(c *x509.Certificate) (string, error) {
	name := ""
	for _, u := range c.URIs {
		s := u.String()
		if !strings.HasPrefix(s, URNPrefix) {
			continue
		}
		if name != "" {
			return "", ErrNoName
		}
		name = strings.TrimPrefix(s, URNPrefix)
	}
	if name == "" {
		return "", ErrNoName
	}
	if err := CheckName(name); err != nil {
		return "", err
	}
	return name, nil
}

// Bundle is this router's certificate and key and the cluster CA. It is
// immutable once loaded, but for its revocation list (Revocations),
// which the cluster's agreed state keeps current.
type Bundle struct {
	// Name is the router name the certificate proves.
	Name string
	// Cert is the certificate chain (leaf first) with its private key;
	// Cert.Leaf is set.
	Cert  tls.Certificate
	roots *x509.CertPool
	// NotAfter is when the leaf expires.
	NotAfter time.Time
	revoked  *Revocations
}

// Revocations is the revocation list every check of a peer's
// certificate consults (VerifyChain, CheckPeer, the TLS configurations
// and Verifier's signature checks).
func (b *Bundle) Revocations() *Revocations { return b.revoked }

// Load reads a router certificate (PEM, leaf first, intermediates may
// follow), its key and the cluster CA, and checks that the certificate is
// signed by the CA and names a router.
func Load(certFile, keyFile, caFile string) (*Bundle, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("identity: set the certificate, its key and the CA together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("identity: no PEM certificate in %s", caFile)
	}
	return NewBundle(cert, roots)
}

// NewBundle checks cert (chain and key) against roots and returns the
// bundle.
func NewBundle(cert tls.Certificate, roots *x509.CertPool) (*Bundle, error) {
	if len(cert.Certificate) == 0 {
		return nil, errors.New("identity: empty certificate")
	}
	if _, ok := cert.PrivateKey.(crypto.Signer); !ok {
		return nil, errors.New("identity: the private key cannot sign")
	}
	b := &Bundle{Cert: cert, roots: roots, revoked: &Revocations{}}
	leaf, name, err := b.VerifyChain(cert.Certificate, UsageRouter)
	if err != nil {
		return nil, fmt.Errorf("identity: this router's certificate: %w", err)
	}
	b.Cert.Leaf, b.Name, b.NotAfter = leaf, name, leaf.NotAfter
	return b, nil
}

// maxChain bounds the certificates a peer may present.
const maxChain = 8

// VerifyChain checks a peer's chain (DER, leaf first) against the cluster
// CA at the current time, for usage u, and against the revocation list,
// and returns the leaf and the router name it proves. Host names are not
// checked: routers reach each other at addresses that change (pod IPs);
// the CA is the cluster's own and the name is in the URI SAN.
func (b *Bundle) VerifyChain(raw [][]byte, u Usage) (*x509.Certificate, string, error) {
	if len(raw) == 0 {
		return nil, "", fmt.Errorf("%w: no certificate", ErrUntrusted)
	}
	if len(raw) > maxChain {
		return nil, "", fmt.Errorf("%w: %d certificates in the chain, at most %d", ErrUntrusted, len(raw), maxChain)
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, "", fmt.Errorf("%w: %v", ErrUntrusted, err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	// Verify checks that the chain allows one of the usages (an
	// intermediate may narrow them); checkUsage that the leaf lists all.
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: b.roots, Intermediates: inter,
		KeyUsages: u.extKeyUsages()}); err != nil {
		var inv x509.CertificateInvalidError
		if errors.As(err, &inv) && inv.Reason == x509.IncompatibleUsage {
			return nil, "", fmt.Errorf("%w: %v", ErrKeyUsage, err)
		}
		return nil, "", fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	if err := checkUsage(certs[0], u); err != nil {
		return nil, "", err
	}
	name, err := NameOf(certs[0])
	if err != nil {
		return nil, "", err
	}
	if err := b.revoked.Check(certs[0], name); err != nil {
		return nil, "", err
	}
	return certs[0], name, nil
}

// CheckPeer returns the router name the verified peer of a TLS
// connection proves, after checking the revocation list again: a
// connection outlives its handshake, and a certificate revoked since
// proves nothing.
func (b *Bundle) CheckPeer(cs tls.ConnectionState) (string, error) {
	name, err := PeerName(cs)
	if err != nil {
		return "", err
	}
	if err := b.revoked.Check(cs.PeerCertificates[0], name); err != nil {
		return "", err
	}
	return name, nil
}

// PeerName returns the router name the verified peer of a TLS connection
// proves (its certificate was checked by the configurations below).
func PeerName(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", fmt.Errorf("%w: no certificate", ErrUntrusted)
	}
	return NameOf(cs.PeerCertificates[0])
}

// ServerConfig is the TLS configuration of a listener other routers
// connect to. With optionalClient a client may connect without a
// certificate (the admin API, where operators use the bearer token); a
// certificate that is presented must be a router's, signed by the CA.
// Without it every client must prove a router name.
func (b *Bundle) ServerConfig(optionalClient bool) *tls.Config {
	auth := tls.RequireAnyClientCert
	if optionalClient {
		auth = tls.RequestClientCert
	}
	return &tls.Config{
		Certificates: []tls.Certificate{b.Cert},
		ClientAuth:   auth,
		MinVersion:   tls.VersionTLS12,
		// Chains are checked against the cluster CA in VerifyConnection,
		// not by the standard host-name verification (see VerifyChain).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 && optionalClient {
				return nil
			}
			_, _, err := b.VerifyChain(rawChain(cs), UsageClient)
			return err
		},
	}
}

// ClientConfig is the TLS configuration to dial another router. expect,
// when not nil, is called with the router name the server proved; an
// error refuses the connection (use ExpectName to require one name).
func (b *Bundle) ClientConfig(expect func(name string) error) *tls.Config {
	return &tls.Config{
		Certificates:       []tls.Certificate{b.Cert},
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // checked in VerifyConnection, against the cluster CA
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, name, err := b.VerifyChain(rawChain(cs), UsageServer)
			if err != nil {
				return err
			}
			if expect != nil {
				return expect(name)
			}
			return nil
		},
	}
}

// ExpectName returns an expect function for ClientConfig that accepts only
// want.
func ExpectName(want string) func(string) error {
	return func(got string) error {
		if got != want {
			return fmt.Errorf("%w: %q proved %q", ErrWrongPeer, want, got)
		}
		return nil
	}
}

func rawChain(cs tls.ConnectionState) [][]byte {
	out := make([][]byte, len(cs.PeerCertificates))
	for i, c := range cs.PeerCertificates {
		out[i] = c.Raw
	}
	return out
}

// Chain returns this router's certificate chain, DER, leaf first.
func (b *Bundle) Chain() [][]byte { return b.Cert.Certificate }

// Sign signs msg with this router's private key (Ed25519 over msg; ECDSA
// and RSA-PSS over its SHA-256).
func (b *Bundle) Sign(msg []byte) ([]byte, error) {
	k := b.Cert.PrivateKey.(crypto.Signer) // checked by NewBundle
	switch k.Public().(type) {
	case ed25519.PublicKey:
		return k.Sign(rand.Reader, msg, crypto.Hash(0))
	case *rsa.PublicKey:
		h := sha256.Sum256(msg)
		return k.Sign(rand.Reader, h[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256})
	default:
		h := sha256.Sum256(msg)
		return k.Sign(rand.Reader, h[:], crypto.SHA256)
	}
}

// VerifySignature reports whether sig is pub's signature of msg, as Sign
// makes them.
func VerifySignature(pub crypto.PublicKey, msg, sig []byte) bool {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return ed25519.Verify(k, msg, sig)
	case *ecdsa.PublicKey:
		h := sha256.Sum256(msg)
		return ecdsa.VerifyASN1(k, h[:], sig)
	case *rsa.PublicKey:
		h := sha256.Sum256(msg)
		return rsa.VerifyPSS(k, crypto.SHA256, h[:], sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}) == nil
	}
	return false
}

// Verifier checks a peer's chain (issued for a router: both usages) and
// returns the router name it proves, a function that verifies that
// router's signatures, and when the proof expires (the leaf's NotAfter).
// It is what gossip needs to tie figures to their sender. gossip keeps
// the function for as long as the proof lasts, so it consults the
// revocation list at every call: a certificate revoked since signs
// nothing.
func (b *Bundle) Verifier(chain [][]byte) (name string, verify func(msg, sig []byte) bool, notAfter time.Time, err error) {
	leaf, name, err := b.VerifyChain(chain, UsageRouter)
	if err != nil {
		return "", nil, time.Time{}, err
	}
	pub, revoked := leaf.PublicKey, b.revoked
	return name, func(msg, sig []byte) bool {
		return revoked.Check(leaf, name) == nil && VerifySignature(pub, msg, sig)
	}, leaf.NotAfter, nil
}
