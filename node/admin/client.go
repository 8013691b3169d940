package admin

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
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

// maxAnswer bounds what the Client reads of an answer.
const maxAnswer = 16 << 20

// NewClient returns a client of the admin API at base (http://host:port
// or https://host:port; a bare host:port is http), authenticating with
// token when it is not empty, over tc when it is not nil (an https URL).
func NewClient(base, token string, tc *tls.Config, timeout time.Duration) (*Client, error) {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("admin URL %q: want http://host:port or https://host:port", base)
	}
	hc := &http.Client{Timeout: timeout}
	if tc != nil {
		hc.Transport = &http.Transport{TLSClientConfig: tc}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: strings.TrimSpace(token), http: hc}, nil
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
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the admin API at %s: %w", c.base, err)
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
		return &APIError{Status: resp.StatusCode, Code: "http_error", Message: strings.TrimSpace(string(raw))}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}
