package chaos

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// AdminAccess is how the engine reaches a target's admin APIs.
type AdminAccess struct {
	// Token is the admin API's bearer token ("" for none).
	Token string
	// TLS, when set, is the client configuration for https admin URLs:
	// routers with cluster TLS serve their admin API with their cluster
	// certificate.
	TLS *tls.Config
}

// caOnlyTLS trusts the certificates pool's CAs signed, whatever host name
// they carry: router certificates name a router (a URI SAN), while the
// engine reaches them at addresses no certificate lists.
func caOnlyTLS(pool *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the chain is verified below, against pool only
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the admin API sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			return err
		},
	}
}

// caFileTLS is caOnlyTLS for the CA certificates in file.
func caFileTLS(file string) (*tls.Config, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("no PEM certificate in %s", file)
	}
	return caOnlyTLS(pool), nil
}

// localPKI creates a cluster CA for one run (its key stays in memory) and
// a certificate for each router in dir/tls: the CA certificate readable by
// all, each router's key readable by its uid alone (uid 0: this
// process's). It returns each router's files and the admin client TLS.
func localPKI(dir string, names []string, uids []int, validity time.Duration) (map[string]proc.ClusterTLS, *tls.Config, error) {
	ca, err := identity.NewCA("warmroute chaos CA", validity)
	if err != nil {
		return nil, nil, err
	}
	tdir := filepath.Join(dir, "tls")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(tdir, 0o755); err != nil {
		return nil, nil, err
	}
	caFile := filepath.Join(tdir, "warmroute-ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		return nil, nil, err
	}
	out := map[string]proc.ClusterTLS{}
	for i, n := range names {
		certPEM, keyPEM, err := ca.Issue(identity.Request{Name: n, Validity: validity})
		if err != nil {
			return nil, nil, err
		}
		f := proc.ClusterTLS{CertFile: filepath.Join(tdir, n+".pem"), KeyFile: filepath.Join(tdir, n+"-key.pem"), CAFile: caFile}
		if err := os.WriteFile(f.CertFile, certPEM, 0o644); err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(f.KeyFile, keyPEM, 0o600); err != nil {
			return nil, nil, err
		}
		if uids[i] > 0 {
			if err := os.Chown(f.KeyFile, uids[i], uids[i]); err != nil {
				return nil, nil, err
			}
		}
		out[n] = f
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return out, caOnlyTLS(pool), nil
}
