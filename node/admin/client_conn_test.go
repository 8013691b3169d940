package admin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestClientConnErrors: the client tells apart an HTTPS server reached
// over http, a plain server reached over https, a certificate it cannot
// verify and nobody answering, so the CLI can say what to do.
func TestClientConnErrors(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"node":"x"}`)) })
	tlsSrv := httptest.NewTLSServer(ok)
	defer tlsSrv.Close()
	plain := httptest.NewServer(ok)
	defer plain.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	pool := x509.NewCertPool()
	pool.AddCert(tlsSrv.Certificate())
	withCA := &tls.Config{RootCAs: pool}
	otherCA := &tls.Config{RootCAs: x509.NewCertPool()}
	tlsHost := strings.TrimPrefix(tlsSrv.URL, "https://")

	for _, c := range []struct {
		name string
		base string
		tc   *tls.Config
		kind ConnKind
		ca   bool
	}{
		{"http to https", "http://" + tlsHost, nil, ConnNeedsHTTPS, false},
		{"https to http", strings.Replace(plain.URL, "http://", "https://", 1), nil, ConnNeedsHTTP, false},
		{"no CA", tlsSrv.URL, nil, ConnUnverified, false},
		{"another CA", tlsSrv.URL, otherCA, ConnUnverified, true},
		{"nobody", "http://" + closed, nil, ConnFailed, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl, err := NewClient(c.base, "", c.tc, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cl.Cluster(context.Background())
			var ce *ConnError
			if !errors.As(err, &ce) || ce.Kind != c.kind || ce.CA != c.ca {
				t.Fatalf("error %v (%#v), want kind %d", err, ce, c.kind)
			}
		})
	}

	// A bare host:port with a CA is https; an http URL with one is an
	// error.
	cl, err := NewClient(tlsHost, "", withCA, 5*time.Second)
	if err != nil || !strings.HasPrefix(cl.URL(), "https://") {
		t.Fatalf("%v %v", cl, err)
	}
	if _, err := cl.Cluster(context.Background()); err != nil {
		t.Fatalf("https with the CA: %v", err)
	}
	if _, err := NewClient("http://"+tlsHost, "", withCA, time.Second); !errors.Is(err, ErrCAOverHTTP) {
		t.Fatalf("http URL with a CA: %v", err)
	}
}
