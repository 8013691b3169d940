package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// adminClient talks to a router's admin API.
type adminClient struct {
	base  string
	token string
	http  *http.Client
}

// adminOpts are the flags every admin command shares.
type adminOpts struct {
	addr, tokenFile, caFile *string
}

// adminFlags binds the shared admin flags.
func adminFlags(fs *flag.FlagSet) adminOpts {
	var o adminOpts
	o.caFile = fs.String("ca-file", os.Getenv("WARMROUTE_ADMIN_CA_FILE"), "CA of the routers' cluster certificates, for an https admin URL (routers with cluster TLS)")
	def := os.Getenv("WARMROUTE_ADMIN_URL")
	if def == "" {
		def = "http://127.0.0.1:9090"
	}
	o.addr = fs.String("admin", def, "a router's admin URL (any router: writes are forwarded to the Raft leader); or WARMROUTE_ADMIN_URL")
	o.tokenFile = fs.String("token-file", os.Getenv("WARMROUTE_ADMIN_TOKEN_FILE"), "file holding the admin bearer token; or WARMROUTE_ADMIN_TOKEN")
	return o
}

func newAdminClient(o adminOpts) (*adminClient, error) {
	addr, tokenFile := *o.addr, *o.tokenFile
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("admin URL %q: want http://host:port", addr)
	}
	tok := os.Getenv("WARMROUTE_ADMIN_TOKEN")
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if *o.caFile != "" {
		tc, err := caOnlyTLS(*o.caFile)
		if err != nil {
			return nil, err
		}
		hc.Transport = &http.Transport{TLSClientConfig: tc}
	}
	return &adminClient{base: strings.TrimRight(addr, "/"), token: strings.TrimSpace(tok), http: hc}, nil
}

// caOnlyTLS trusts certificates signed by the CA in file, whatever host
// name they carry (routers' cluster certificates name no host).
func caOnlyTLS(file string) (*tls.Config, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("ca file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca file %s: no PEM certificate", file)
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the chain is verified below, against the CA only
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("the admin API sent no certificate")
			}
			c, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, r := range raw[1:] {
				if ic, err := x509.ParseCertificate(r); err == nil {
					inter.AddCert(ic)
				}
			}
			_, err = c.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			return err
		},
	}, nil
}

// do sends a request and returns the decoded JSON answer, or the API's
// error message.
func (c *adminClient) do(ctx context.Context, method, path string, body any) (map[string]any, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the admin API at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if resp.StatusCode >= 300 {
		if e, ok := out["error"].(map[string]any); ok {
			return nil, fmt.Errorf("%s (HTTP %d, %v)", e["message"], resp.StatusCode, e["code"])
		}
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return out, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("warmroute status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print the raw JSON")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: warmroute status [flags]\n\nShow the cluster: members, Raft leader and voters, ring epoch, and each backend's state, health and load.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := newAdminClient(opts)
	if err != nil {
		return err
	}
	cl, err := c.do(ctx, "GET", "/v1/cluster", nil)
	if err != nil {
		return err
	}
	bs, err := c.do(ctx, "GET", "/v1/backends", nil)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"cluster": cl, "backends": bs["backends"]})
	}
	raft, _ := cl["raft"].(map[string]any)
	fmt.Fprintf(stdout, "node %v  epoch %v  raft %v  leader %v  term %v\n", cl["node"], cl["epoch"], raft["raft_state"], raft["leader_id"], raft["term"])
	if servers, ok := raft["servers"].([]any); ok {
		fmt.Fprintf(stdout, "\nRAFT SERVER           ADDRESS               VOTER\n")
		for _, s := range servers {
			m := s.(map[string]any)
			fmt.Fprintf(stdout, "%-21v %-21v %v\n", m["id"], m["addr"], m["voter"])
		}
	}
	if members, ok := cl["members"].([]any); ok && len(members) > 0 {
		fmt.Fprintf(stdout, "\nMEMBER                STATE    ZONE       ADMIN\n")
		for _, s := range members {
			m := s.(map[string]any)
			fmt.Fprintf(stdout, "%-21v %-8v %-10v %v\n", m["name"], m["state"], orDash(m["zone"]), m["admin_addr"])
		}
	}
	fmt.Fprintf(stdout, "\nBACKEND                    STATE     HEALTHY  IN-FLIGHT  LIMIT  ZONE\n")
	list, _ := bs["backends"].([]any)
	for _, x := range list {
		b := x.(map[string]any)
		live, _ := b["live"].(map[string]any)
		inflight := "-"
		healthy, limit := "-", "-"
		if live != nil {
			inflight = fmt.Sprintf("%v+%v", live["in_flight"], live["remote_in_flight"])
			healthy = fmt.Sprint(live["healthy"])
			limit = fmt.Sprint(live["limit"])
		}
		fmt.Fprintf(stdout, "%-26v %-9v %-8v %-10v %-6v %v\n", b["id"], b["state"], healthy, inflight, limit, orDash(b["zone"]))
	}
	return nil
}

func orDash(v any) any {
	if v == nil || v == "" {
		return "-"
	}
	return v
}

func cmdBackends(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("warmroute backends", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := adminFlags(fs)
	id := fs.String("id", "", "add: backend id (default host:port of the URL)")
	zone := fs.String("zone", "", "add: availability zone")
	weight := fs.Int("weight", 0, "add: weight (scales the concurrency limit)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: warmroute backends [flags] list
       warmroute backends [flags] add URL
       warmroute backends [flags] remove|drain|activate|down ID

Change the agreed backend set through any router; the change is committed
through Raft and every router rebuilds its ring at the same epoch.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("backends: missing action")
	}
	c, err := newAdminClient(opts)
	if err != nil {
		return err
	}
	need := func(n int) error {
		if len(rest) != n+1 {
			return fmt.Errorf("backends %s: want %d argument(s)", rest[0], n)
		}
		return nil
	}
	var out map[string]any
	switch rest[0] {
	case "list", "ls":
		out, err = c.do(ctx, "GET", "/v1/backends", nil)
	case "add":
		if err = need(1); err == nil {
			out, err = c.do(ctx, "POST", "/v1/backends", map[string]any{"url": rest[1], "id": *id, "zone": *zone, "weight": *weight})
		}
	case "remove", "rm":
		if err = need(1); err == nil {
			out, err = c.do(ctx, "DELETE", "/v1/backends/"+url.PathEscape(rest[1]), nil)
		}
	case "drain", "activate", "undrain", "down":
		if err = need(1); err == nil {
			out, err = c.do(ctx, "POST", "/v1/backends/"+url.PathEscape(rest[1])+"/"+rest[0], nil)
		}
	default:
		return fmt.Errorf("backends: unknown action %q (want list, add, remove, drain, activate or down)", rest[0])
	}
	if err != nil {
		return err
	}
	return printJSON(stdout, out)
}

func cmdConfig(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("warmroute config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := adminFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: warmroute config [flags] get
       warmroute config [flags] set key=value [key=value...]

Read or change the agreed routing config. Keys: strategy, prefix_length,
concurrency_threshold, load_factor, invocations_json, busy_is_full,
overflow_depth, partition_count, zone_aware (SageMaker's RoutingStrategy,
PrefixLength and ConcurrencyThreshold work too).

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("config: missing action")
	}
	c, err := newAdminClient(opts)
	if err != nil {
		return err
	}
	var out map[string]any
	switch rest[0] {
	case "get":
		out, err = c.do(ctx, "GET", "/v1/config", nil)
	case "set":
		if len(rest) < 2 {
			return errors.New("config set: want key=value")
		}
		patch := map[string]any{}
		for _, kv := range rest[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("config set: %q is not key=value", kv)
			}
			patch[k] = configValue(v)
		}
		out, err = c.do(ctx, "PATCH", "/v1/config", patch)
	default:
		return fmt.Errorf("config: unknown action %q (want get or set)", rest[0])
	}
	if err != nil {
		return err
	}
	return printJSON(stdout, out)
}

// configValue types a command-line value: integers and finite numbers as
// JSON numbers, "true" and "false" (any case) as booleans, anything else
// as a string. (strconv.ParseBool would also take "1", "0" and "t", so
// concurrency_threshold=1 went out as true.)
func configValue(v string) any {
	if i, err := strconv.ParseInt(v, 10, 64); err == nil {
		return i
	}
	switch strings.ToLower(v) {
	case "true":
		return true
	case "false":
		return false
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
		return f
	}
	return v
}
