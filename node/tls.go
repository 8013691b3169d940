package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
)

// TLS configures transport security.
type TLS struct {
	// CertFile and KeyFile turn on TLS on the client-facing listener.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClusterCertFile, ClusterKeyFile and ClusterCAFile turn on mutual TLS
	// for traffic between routers: Raft, and the admin API (which then
	// serves HTTPS; writes forwarded to the leader present this router's
	// certificate). Every router's certificate must be signed by the CA.
	ClusterCertFile string `yaml:"cluster_cert_file"`
	ClusterKeyFile  string `yaml:"cluster_key_file"`
	ClusterCAFile   string `yaml:"cluster_ca_file"`
}

// clientEnabled and clusterEnabled say which parts are configured.
func (t *TLS) clientEnabled() bool { return t.CertFile != "" || t.KeyFile != "" }
func (t *TLS) clusterEnabled() bool {
	return t.ClusterCertFile != "" || t.ClusterKeyFile != "" || t.ClusterCAFile != ""
}

func (t *TLS) validate() []error {
	var errs []error
	if t.clientEnabled() {
		if _, err := t.clientConfig(); err != nil {
			errs = append(errs, err)
		}
	}
	if t.clusterEnabled() {
		if _, err := t.clusterConfig(false); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// clientConfig is the client-facing listener's TLS.
func (t *TLS) clientConfig() (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("tls: set both tls-cert-file and tls-key-file")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// clusterConfig is the mutual TLS between routers. Peers are verified
// against the cluster CA, not by host name: routers reach each other by
// addresses that change (pod IPs), and the CA is the cluster's own. With
// optionalClient a peer may connect without a certificate (the admin API,
// where operators authenticate with the token instead); a certificate that
// is presented is always verified.
func (t *TLS) clusterConfig(optionalClient bool) (*tls.Config, error) {
	if t.ClusterCertFile == "" || t.ClusterKeyFile == "" || t.ClusterCAFile == "" {
		return nil, errors.New("cluster tls: set cluster-tls-cert-file, cluster-tls-key-file and cluster-tls-ca-file together")
	}
	cert, err := tls.LoadX509KeyPair(t.ClusterCertFile, t.ClusterKeyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster tls: %w", err)
	}
	pem, err := os.ReadFile(t.ClusterCAFile)
	if err != nil {
		return nil, fmt.Errorf("cluster tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cluster tls: no PEM certificate in %s", t.ClusterCAFile)
	}
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			if optionalClient {
				return nil
			}
			return errors.New("cluster tls: the peer sent no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return fmt.Errorf("cluster tls: peer certificate: %w", err)
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err != nil {
			return fmt.Errorf("cluster tls: peer certificate not signed by the cluster CA: %w", err)
		}
		return nil
	}
	auth := tls.RequireAnyClientCert
	if optionalClient {
		auth = tls.RequestClientCert
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   auth,
		// The chain is checked by VerifyPeerCertificate against the
		// cluster CA, in both directions; host names are not (see above).
		InsecureSkipVerify:    true,
		VerifyPeerCertificate: verify,
		MinVersion:            tls.VersionTLS12,
	}, nil
}

// setupTLS wraps the listeners and the admin client as configured. The
// cluster config also goes to Raft (startAgreement reads n.clusterTLS).
func (n *Node) setupTLS() error {
	t := &n.cfg.TLS
	if t.clientEnabled() {
		c, err := t.clientConfig()
		if err != nil {
			return err
		}
		n.trafficLn = tls.NewListener(n.trafficLn, c)
	}
	if !t.clusterEnabled() {
		return nil
	}
	server, err := t.clusterConfig(true)
	if err != nil {
		return err
	}
	client, err := t.clusterConfig(false)
	if err != nil {
		return err
	}
	n.adminLn = tls.NewListener(n.adminLn, server)
	n.clusterTLS = client
	n.adminScheme = "https"
	n.adminClient.Transport = &http.Transport{TLSClientConfig: client, MaxIdleConnsPerHost: 4}
	return nil
}
