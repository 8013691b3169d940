package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/limit"
	"github.com/warmroute/warmroute/proxy/extproc"
)

// ExtProc configures the endpoint-picker listener: Envoy's external
// processing protocol, for a gateway that forwards requests itself and
// asks the router where each goes (proxy/extproc).
type ExtProc struct {
	// Listen turns the listener on ("" keeps it off).
	Listen string `yaml:"listen"`
	// HealthListen serves the gRPC health service alone, in plaintext,
	// for Kubernetes' gRPC probes ("" : only on Listen).
	HealthListen string `yaml:"health_listen"`
	// CertFile and KeyFile are the listener's certificate. Without them it
	// serves the client listener's (tls-cert-file), else a self-signed
	// certificate made at start, as the reference pickers do: gateways do
	// not verify the picker's certificate.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// Plaintext serves without TLS; only on a loopback address.
	Plaintext bool `yaml:"plaintext"`
	// MaxConns bounds the gateway connections (and per address, the
	// same); MaxStreams the requests open at once (429 over it).
	MaxConns   int `yaml:"max_conns"`
	MaxStreams int `yaml:"max_streams"`
	// Fallbacks is how many endpoints follow the primary in the answer.
	Fallbacks int `yaml:"fallbacks"`
}

func defaultExtProc() ExtProc {
	d := extproc.DefaultConfig()
	return ExtProc{MaxConns: 1024, MaxStreams: d.MaxStreams, Fallbacks: d.Fallbacks}
}

func (e *ExtProc) validate(t *TLS) []error {
	if e.Listen == "" {
		if e.HealthListen != "" {
			return []error{errors.New("ext-proc-health-listen is set but ext-proc-listen is empty")}
		}
		return nil
	}
	var errs []error
	if err := checkListen(e.Listen); err != nil {
		errs = append(errs, fmt.Errorf("ext-proc-listen: %w", err))
	}
	if e.HealthListen != "" {
		if err := checkListen(e.HealthListen); err != nil {
			errs = append(errs, fmt.Errorf("ext-proc-health-listen: %w", err))
		}
	}
	if e.MaxConns < 1 || e.MaxStreams < 1 {
		errs = append(errs, fmt.Errorf("ext-proc-max-conns and ext-proc-max-streams must be positive"))
	}
	if e.Fallbacks < 0 || e.Fallbacks > 16 {
		errs = append(errs, fmt.Errorf("ext-proc-fallbacks %d outside [0, 16]", e.Fallbacks))
	}
	if e.Plaintext {
		if host, _, err := net.SplitHostPort(e.Listen); err == nil && !loopbackHost(host) {
			errs = append(errs, fmt.Errorf("ext-proc-listen %s is reachable from other hosts: --ext-proc-plaintext is for loopback only (gateways speak TLS to the picker)", e.Listen))
		}
	}
	if _, err := e.tlsConfig(t); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// tlsConfig is the listener's TLS: nil in plaintext.
func (e *ExtProc) tlsConfig(t *TLS) (*tls.Config, error) {
	if e.Plaintext {
		return nil, nil
	}
	var cert tls.Certificate
	var err error
	switch {
	case e.CertFile != "" || e.KeyFile != "":
		if e.CertFile == "" || e.KeyFile == "" {
			return nil, errors.New("ext-proc tls: set both ext-proc-tls-cert-file and ext-proc-tls-key-file")
		}
		cert, err = tls.LoadX509KeyPair(e.CertFile, e.KeyFile)
	case t.CertFile != "" && t.KeyFile != "":
		cert, err = tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	default:
		cert, err = selfSigned()
	}
	if err != nil {
		return nil, fmt.Errorf("ext-proc tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
}

// selfSigned makes a certificate for the picker's listener, valid a
// year: what the reference pickers serve when given none.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"warmroute"}, CommonName: "warmroute endpoint picker"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", hostname()},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// extProcNode is the picker listener of a node.
type extProcNode struct {
	srv        *extproc.Server
	ln, health net.Listener
	tls        bool
}

// startExtProc binds the picker's listeners, when configured.
func (n *Node) startExtProc() error {
	e := &n.cfg.ExtProc
	if e.Listen == "" {
		return nil
	}
	tc, err := e.tlsConfig(&n.cfg.TLS)
	if err != nil {
		return err
	}
	cfg := extproc.DefaultConfig()
	cfg.TLS = tc
	cfg.MaxStreams = e.MaxStreams
	cfg.Fallbacks = e.Fallbacks
	cfg.MaxBodySize = int(n.cfg.Limits.MaxBodySize)
	cfg.ReadTimeout = n.cfg.Limits.ReadTimeout
	cfg.FirstByteTimeout = n.cfg.Upstream.FirstByteTimeout
	cfg.StreamIdleTimeout = n.cfg.Upstream.StreamIdleTimeout
	cfg.Ready = n.proxy.Synced
	cfg.Logger = n.log.With("component", "extproc")
	cfg.Registry = n.reg
	x := &extProcNode{tls: tc != nil}
	if x.srv, err = extproc.New(cfg, n.proxy); err != nil {
		return err
	}
	n.extProc = x
	if x.ln, err = net.Listen("tcp", e.Listen); err != nil {
		return fmt.Errorf("ext-proc listen %s: %w", e.Listen, err)
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "extproc",
		Name: "connections_refused_total", Help: "Gateway connections closed at once over the picker listener's caps, by reason (limit, limit_per_ip)."}, []string{"reason"})
	n.reg.MustRegister(refused)
	x.ln = limit.NewListener(x.ln, e.MaxConns, e.MaxConns, func(r string) { refused.WithLabelValues(r).Inc() })
	if e.HealthListen != "" {
		if x.health, err = net.Listen("tcp", e.HealthListen); err != nil {
			return fmt.Errorf("ext-proc health listen %s: %w", e.HealthListen, err)
		}
		x.health = limit.NewListener(x.health, 64, 64, nil)
	}
	return nil
}

// ExtProcAddr is the bound picker address, or nil when it is off.
func (n *Node) ExtProcAddr() net.Addr {
	if n.extProc == nil || n.extProc.ln == nil {
		return nil
	}
	return n.extProc.ln.Addr()
}

// serveExtProc serves the picker listeners; each Serve's end is sent on
// errc. It returns how many were started.
func (x *extProcNode) serve(errc chan<- error, log *slog.Logger) int {
	if x == nil {
		return 0
	}
	health := ""
	if x.health != nil {
		health = x.health.Addr().String()
	}
	log.Info("endpoint picker serving", "ext_proc", x.ln.Addr().String(), "tls", x.tls, "health", health)
	go func() { errc <- x.srv.Serve(x.ln) }()
	if x.health == nil {
		return 1
	}
	go func() { errc <- x.srv.ServeHealth(x.health) }()
	return 2
}

// shutdown drains the picker's streams until ctx ends.
func (x *extProcNode) shutdown(ctx context.Context) error {
	if x == nil {
		return nil
	}
	return x.srv.Shutdown(ctx)
}

// close releases what startExtProc took when Run never serves it.
func (x *extProcNode) close() {
	if x == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	x.srv.Shutdown(ctx)
	for _, ln := range []net.Listener{x.ln, x.health} {
		if ln != nil {
			ln.Close()
		}
	}
}
