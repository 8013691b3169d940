package admin

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to a router's admin API (any router: writes are forwarded
// to the Raft leader).
type Client struct {
	base  string
	token string
	ca    bool // the server is verified against a CA given to NewClient
	http  *http.Client
}

// APIError is an error the admin API answered with.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (HTTP %d, %s)", e.Message, e.Status, e.Code)
}

// ConnKind tells why a Client could not talk to the admin API.
type ConnKind int

const (
	// ConnFailed: nothing answered (refused, timed out, no route).
	ConnFailed ConnKind = iota
	// ConnNeedsHTTPS: the server speaks HTTPS and the URL is http (a
	// router with cluster TLS serves its admin API over HTTPS only).
	ConnNeedsHTTPS
	// ConnNeedsHTTP: the URL is https and the server speaks plain HTTP.
	ConnNeedsHTTP
	// ConnUnverified: the server's certificate could not be verified:
	// no CA was given (routers' certificates name no host, so the
	// system's roots and host names never verify them), or another CA.
	ConnUnverified
)

// ConnError is a failure to talk to the admin API at URL at all. CA says
// whether the Client verifies the server against a CA it was given.
type ConnError struct {
	URL  string
	Kind ConnKind
	CA   bool
	Err  error
}

func (e *ConnError) Error() string {
	switch e.Kind {
	case ConnNeedsHTTPS:
		return fmt.Sprintf("the admin API at %s speaks HTTPS, not plain HTTP", e.URL)
	case ConnNeedsHTTP:
		return fmt.Sprintf("the admin API at %s speaks plain HTTP, not HTTPS: %v", e.URL, e.Err)
	case ConnUnverified:
		return fmt.Sprintf("cannot verify the certificate of the admin API at %s: %v", e.URL, e.Err)
	}
	return fmt.Sprintf("cannot reach the admin API at %s: %v", e.URL, e.Err)
}

func (e *ConnError) Unwrap() error { return e.Err }

// connError classifies a failed round trip to the admin API.
func (c *Client) connError(err error) *ConnError {
	e := &ConnError{URL: c.base, CA: c.ca, Err: err}
	var (
		rec     tls.RecordHeaderError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		verify  *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &rec), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		e.Kind = ConnNeedsHTTP
	case errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid), errors.As(err, &verify):
		e.Kind = ConnUnverified
	}
	return e
}

// httpToHTTPS is what Go's HTTP server answers a plain HTTP request on a
// TLS listener.
const httpToHTTPS = "Client sent an HTTP request to an HTTPS server."

// maxAnswer bounds what the Client reads of an answer.
const maxAnswer = 16 << 20

// ErrCAOverHTTP: a CA was given for an http URL, where it would verify
// nothing.
var ErrCAOverHTTP = errors.New("a CA verifies an https admin URL only")

// NewClient returns a client of the admin API at base (http://host:port
// or https://host:port), authenticating with token when it is not empty.
// With tc (which verifies the routers' certificates against their CA) a
// bare host:port is https, and an http URL is an error (ErrCAOverHTTP);
// without it a bare host:port is http.
func NewClient(base, token string, tc *tls.Config, timeout time.Duration) (*Client, error) {
	if !strings.Contains(base, "://") {
		if tc != nil {
			base = "https://" + base
		} else {
			base = "http://" + base
		}
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("admin URL %q: want http://host:port or https://host:port", base)
	}
	if tc != nil && u.Scheme == "http" {
		return nil, fmt.Errorf("%w: %s is plain HTTP; use https://%s", ErrCAOverHTTP, base, u.Host)
	}
	hc := &http.Client{Timeout: timeout}
	if tc != nil {
		hc.Transport = &http.Transport{TLSClientConfig: tc}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: strings.TrimSpace(token), ca: tc != nil, http: hc}, nil
}

// Status is GET /status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var out Status
	return out, c.do(ctx, "GET", "/status", nil, &out)
}

// Cluster is GET /v1/cluster.
func (c *Client) Cluster(ctx context.Context) (ClusterView, error) {
	var out ClusterView
	return out, c.do(ctx, "GET", "/v1/cluster", nil, &out)
}

// Backends is GET /v1/backends.
func (c *Client) Backends(ctx context.Context) (BackendList, error) {
	var out BackendList
	return out, c.do(ctx, "GET", "/v1/backends", nil, &out)
}

// Backend is GET /v1/backends/{id}.
func (c *Client) Backend(ctx context.Context, id string) (BackendDoc, error) {
	var out BackendDoc
	return out, c.do(ctx, "GET", "/v1/backends/"+url.PathEscape(id), nil, &out)
}

// AddBackend adds a backend or replaces the one with the same ID.
func (c *Client) AddBackend(ctx context.Context, req BackendRequest) (WriteResult, error) {
	var out WriteResult
	return out, c.do(ctx, "POST", "/v1/backends", req, &out)
}

// RemoveBackend removes a backend.
func (c *Client) RemoveBackend(ctx context.Context, id string) (WriteResult, error) {
	var out WriteResult
	return out, c.do(ctx, "DELETE", "/v1/backends/"+url.PathEscape(id), nil, &out)
}

// Backend actions for SetBackendState.
const (
	ActionDrain    = "drain"
	ActionActivate = "activate"
	ActionDown     = "down"
)

// SetBackendState drains, activates or takes down a backend (an Action).
func (c *Client) SetBackendState(ctx context.Context, id, action string) (WriteResult, error) {
	var out WriteResult
	return out, c.do(ctx, "POST", "/v1/backends/"+url.PathEscape(id)+"/"+url.PathEscape(action), nil, &out)
}

// Config is GET /v1/config.
func (c *Client) Config(ctx context.Context) (ConfigDoc, error) {
	var out ConfigDoc
	return out, c.do(ctx, "GET", "/v1/config", nil, &out)
}

// PatchConfig changes the routing settings named in patch (by their admin
// API names, ring.SettingInfo.JSON) and leaves the others.
func (c *Client) PatchConfig(ctx context.Context, patch map[string]any) (WriteResult, error) {
	var out WriteResult
	return out, c.do(ctx, "PATCH", "/v1/config", patch, &out)
}

// Revocations is GET /v1/revocations.
func (c *Client) Revocations(ctx context.Context) (Revocations, error) {
	var out Revocations
	return out, c.do(ctx, "GET", "/v1/revocations", nil, &out)
}

// Revoke adds router names and certificate serial numbers to the
// cluster's revocation list.
func (c *Client) Revoke(ctx context.Context, req RevocationRequest) (WriteResult, error) {
	var out WriteResult
	return out, c.do(ctx, "POST", "/v1/revocations", req, &out)
}

// Unrevoke takes router names and certificate serial numbers off the
// cluster's revocation list.
func (c *Client) Unrevoke(ctx context.Context, req RevocationRequest) (WriteResult, error) {
	var out WriteResult
	return out, c.do(ctx, "DELETE", "/v1/revocations", req, &out)
}

// URL is the admin API's base URL (with its scheme: a bare host:port was
// given one).
func (c *Client) URL() string { return c.base }

// Explain asks the route explainer where a request a client sends to
// path (e.g. /v1/chat/completions; any API path /debug/route takes) with
// body and header (the tenant and session headers count) would go on
// this router, and why. Nothing is forwarded to a backend.
func (c *Client) Explain(ctx context.Context, path string, body []byte, header http.Header) (Explanation, error) {
	var out Explanation
	if len(body) > maxExplainBody {
		return out, fmt.Errorf("request body of %d bytes: the route explainer reads at most %d", len(body), maxExplainBody)
	}
	return out, c.send(ctx, "POST", "/debug/route/"+strings.TrimLeft(path, "/"), bytes.NewReader(body), header, &out)
}

// do sends a request with body (JSON, when not nil) and decodes the answer
// into out, or returns the API's error as an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	return c.send(ctx, method, path, r, nil, out)
}

// send sends a request with body r and header (besides the JSON content
// type and the token) and decodes the answer into out.
func (c *Client) send(ctx context.Context, method, path string, r io.Reader, header http.Header, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("admin API at %s: %w", c.base, ctx.Err())
		}
		return c.connError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
		}
		if resp.StatusCode == http.StatusBadRequest && strings.TrimSpace(string(raw)) == httpToHTTPS {
			return &ConnError{URL: c.base, Kind: ConnNeedsHTTPS, CA: c.ca}
		}
		return &APIError{Status: resp.StatusCode, Code: "http_error", Message: strings.TrimSpace(string(raw))}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}
