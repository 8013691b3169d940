package node

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/warmroute/warmroute/internal/identity"
)

// TLS configures transport security.
type TLS struct {
	// CertFile and KeyFile turn on TLS on the client-facing listener.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClusterCertFile, ClusterKeyFile and ClusterCAFile turn on mutual TLS
	// between routers: Raft, the admin API (which then serves HTTPS;
	// writes forwarded to the leader present this router's certificate)
	// and the signatures on gossiped figures. Every router's certificate
	// must be signed by the CA and name the router
	// (urn:warmroute:router:<node-name>; 'warmroute tls cert create'
	// makes them).
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
		if _, err := t.clusterIdentity(); err != nil {
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

// clusterIdentity loads this router's cluster certificate, or returns nil
// when cluster TLS is off.
func (t *TLS) clusterIdentity() (*identity.Bundle, error) {
	if !t.clusterEnabled() {
		return nil, nil
	}
	if t.ClusterCertFile == "" || t.ClusterKeyFile == "" || t.ClusterCAFile == "" {
		return nil, errors.New("cluster tls: set cluster-tls-cert-file, cluster-tls-key-file and cluster-tls-ca-file together")
	}
	b, err := identity.Load(t.ClusterCertFile, t.ClusterKeyFile, t.ClusterCAFile)
	if err != nil {
		return nil, fmt.Errorf("cluster tls: %w", err)
	}
	return b, nil
}

// setupTLS wraps the listeners as configured: TLS for clients, and with a
// cluster identity HTTPS on the admin listener, where a client may present
// a router certificate (forwarded writes do) or none (operators, who use
// the token). Raft and gossip take the identity in startAgreement and
// startGossip.
func (n *Node) setupTLS() error {
	t := &n.cfg.TLS
	if t.clientEnabled() {
		c, err := t.clientConfig()
		if err != nil {
			return err
		}
		n.trafficLn = tls.NewListener(n.trafficLn, c)
	}
	if n.identity == nil {
		return nil
	}
	n.adminLn = tls.NewListener(n.adminLn, n.identity.ServerConfig(true))
	return nil
}
