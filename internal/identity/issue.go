package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"time"
)

// CA is a cluster certificate authority: it signs router certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a self-signed cluster CA (ECDSA P-256) named commonName,
// valid for validity from now.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"warmroute"}},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadCA reads a CA certificate and its private key (PEM).
func LoadCA(certFile, keyFile string) (*CA, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("identity: CA: %w", err)
	}
	blk, _ := pem.Decode(cb)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("identity: CA: no PEM certificate in %s", certFile)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("identity: CA: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("identity: CA: %s is not a CA certificate", certFile)
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("identity: CA key: %w", err)
	}
	key, err := ParseKeyPEM(kb)
	if err != nil {
		return nil, fmt.Errorf("identity: CA key %s: %w", keyFile, err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("identity: CA key %s does not belong to %s", keyFile, certFile)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// ParseKeyPEM parses a PKCS#8, EC or PKCS#1 private key in PEM.
func ParseKeyPEM(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	var k any
	var err error
	switch blk.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("the key cannot sign")
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// CertPEM is the CA certificate in PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM is the CA's private key in PEM (PKCS#8).
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.Key) }

// Request describes a router certificate to issue.
type Request struct {
	// Name is the router's node name (the URI SAN, and the common name).
	Name string
	// DNSNames and IPs are added as SANs, for clients that verify host
	// names (Prometheus scraping an HTTPS admin listener, say). Routers do
	// not need them.
	DNSNames []string
	IPs      []net.IP
	// Validity is how long the certificate is valid from now.
	Validity time.Duration
}

// Issue creates a key (ECDSA P-256) and a certificate for a router, signed
// by ca, usable as TLS server and client. It returns both in PEM.
func (ca *CA) Issue(r Request) (certPEM, keyPEMBytes []byte, err error) {
	if err := CheckName(r.Name); err != nil {
		return nil, nil, err
	}
	if r.Validity <= 0 {
		return nil, nil, errors.New("identity: validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	notAfter := now.Add(r.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial,
		Subject:        pkix.Name{CommonName: r.Name, Organization: []string{"warmroute"}},
		NotBefore:      now.Add(-5 * time.Minute),
		NotAfter:       notAfter,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:           []*url.URL{URI(r.Name)},
		DNSNames:       r.DNSNames,
		IPAddresses:    r.IPs,
		SubjectKeyId:   keyID(&key.PublicKey),
		AuthorityKeyId: ca.Cert.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: sign: %w", err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

func keyPEM(k crypto.Signer) ([]byte, error) {
	b, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b}), nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func keyID(pub crypto.PublicKey) []byte {
	b, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil
	}
	h := sha256.Sum256(b)
	return h[:20]
}

// Bundle issues a router certificate (as Issue) and returns it as a
// Bundle that trusts this CA alone: for tests and tools that run routers
// of their own.
func (ca *CA) Bundle(r Request) (*Bundle, error) {
	certPEM, keyPEM, err := ca.Issue(r)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return NewBundle(cert, roots)
}
