package identity

import (
	"crypto/x509"
	"fmt"
	"strings"
	"sync/atomic"
)

// Revocations is a cluster's list of revoked router names and
// certificate serial numbers: a certificate that names a revoked router,
// or whose serial number is revoked, proves nothing, however valid its
// chain. The list is agreed through Raft (the cluster package keeps it in
// its state and calls Set on every change); every check of a peer's
// certificate reads it. It is safe for concurrent use; the zero value
// revokes nothing.
type Revocations struct {
	set atomic.Pointer[revocationSet]
}

type revocationSet struct {
	names, serials map[string]bool
}

// MaxSerialHex bounds a serial number in hex: RFC 5280 allows 20 octets.
const MaxSerialHex = 40

// Set replaces the list. Names and serials must be in their canonical
// forms (CheckName, CanonicalSerial); others match nothing.
func (r *Revocations) Set(names, serials []string) {
	s := &revocationSet{names: make(map[string]bool, len(names)), serials: make(map[string]bool, len(serials))}
	for _, n := range names {
		s.names[n] = true
	}
	for _, v := range serials {
		s.serials[v] = true
	}
	r.set.Store(s)
}

// Check returns an ErrRevoked error when c, which proves router name, is
// revoked by name or by serial number.
func (r *Revocations) Check(c *x509.Certificate, name string) error {
	if r == nil {
		return nil
	}
	s := r.set.Load()
	if s == nil {
		return nil
	}
	if s.names[name] {
		return fmt.Errorf("%w: router name %q is revoked", ErrRevoked, name)
	}
	if len(s.serials) > 0 && s.serials[Serial(c)] {
		return fmt.Errorf("%w: certificate serial %s (router %q) is revoked", ErrRevoked, Serial(c), name)
	}
	return nil
}

// Serial is c's serial number as revocation lists hold it: lowercase hex
// without leading zeros, as 'warmroute tls show' prints it.
func Serial(c *x509.Certificate) string {
	if c.SerialNumber == nil {
		return ""
	}
	return c.SerialNumber.Text(16)
}

// CanonicalSerial turns a serial number as an operator may write it
// (hex, any case, with or without ':' between octets, leading zeros or a
// 0x prefix) into the form Serial returns.
func CanonicalSerial(s string) (string, error) {
	orig := s
	s = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "0x")
	s = strings.ReplaceAll(s, ":", "")
	if s == "" || len(s) > 2*MaxSerialHex {
		return "", fmt.Errorf("identity: serial number %q: want 1-%d hex digits", orig, MaxSerialHex)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", fmt.Errorf("identity: serial number %q: hex digits only (as 'warmroute tls show' prints it)", orig)
		}
	}
	s = strings.TrimLeft(s, "0")
	if s == "" {
		s = "0"
	}
	if len(s) > MaxSerialHex {
		return "", fmt.Errorf("identity: serial number %q: want 1-%d hex digits", orig, MaxSerialHex)
	}
	return s, nil
}
