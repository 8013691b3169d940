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
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/ring"
)

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

// newAdminClient builds the admin API client the flags describe.
func newAdminClient(o adminOpts) (*admin.Client, error) {
	tok := os.Getenv("WARMROUTE_ADMIN_TOKEN")
	if *o.tokenFile != "" {
		b, err := os.ReadFile(*o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	var tc *tls.Config
	if *o.caFile != "" {
		var err error
		if tc, err = caOnlyTLS(*o.caFile); err != nil {
			return nil, err
		}
	}
	return admin.NewClient(*o.addr, tok, tc, 30*time.Second)
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
	cl, err := c.Cluster(ctx)
	if err != nil {
		return err
	}
	bs, err := c.Backends(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"cluster": cl, "backends": bs.Backends})
	}
	raft := cl.Raft
	fmt.Fprintf(stdout, "node %v  epoch %v  raft %v  leader %v  term %v\n", cl.Node, cl.Epoch, raft.RaftState, raft.LeaderID, raft.Term)
	if len(raft.Servers) > 0 {
		fmt.Fprintf(stdout, "\nRAFT SERVER           ADDRESS               VOTER\n")
		for _, s := range raft.Servers {
			fmt.Fprintf(stdout, "%-21v %-21v %v\n", s.ID, s.Addr, s.Voter)
		}
	}
	if len(cl.Members) > 0 {
		fmt.Fprintf(stdout, "\nMEMBER                STATE    ZONE       ADMIN\n")
		for _, m := range cl.Members {
			fmt.Fprintf(stdout, "%-21v %-8v %-10v %v\n", m.Name, m.State, orDash(m.Zone), m.AdminAddr)
		}
	}
	fmt.Fprintf(stdout, "\nBACKEND                    STATE     HEALTHY  IN-FLIGHT  LIMIT  ZONE\n")
	for _, b := range bs.Backends {
		inflight, healthy, limit := "-", "-", "-"
		if l := b.Live; l != nil {
			inflight = fmt.Sprintf("%v+%v", l.InFlight, l.RemoteInFlight)
			healthy = fmt.Sprint(l.Healthy)
			limit = fmt.Sprint(l.Limit)
		}
		fmt.Fprintf(stdout, "%-26v %-9v %-8v %-10v %-6v %v\n", b.ID, b.State, healthy, inflight, limit, orDash(b.Zone))
	}
	return nil
}

// actionArgs parses an admin command's flags and returns its action and
// arguments and the admin client; an action is required.
func actionArgs(fs *flag.FlagSet, args []string, opts adminOpts) ([]string, *admin.Client, error) {
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return nil, nil, fmt.Errorf("%s: missing action", strings.TrimPrefix(fs.Name(), "warmroute "))
	}
	c, err := newAdminClient(opts)
	return rest, c, err
}

func orDash(v string) string {
	if v == "" {
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
	rest, c, err := actionArgs(fs, args, opts)
	if err != nil {
		return err
	}
	need := func(n int) error {
		if len(rest) != n+1 {
			return fmt.Errorf("backends %s: want %d argument(s)", rest[0], n)
		}
		return nil
	}
	var out any
	switch rest[0] {
	case "list", "ls":
		out, err = c.Backends(ctx)
	case "add":
		if err = need(1); err == nil {
			out, err = c.AddBackend(ctx, admin.BackendRequest{URL: rest[1], ID: *id, Zone: *zone, Weight: *weight})
		}
	case "remove", "rm":
		if err = need(1); err == nil {
			out, err = c.RemoveBackend(ctx, rest[1])
		}
	case "drain", "activate", "undrain", "down":
		if err = need(1); err == nil {
			out, err = c.SetBackendState(ctx, rest[1], rest[0])
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

Read or change the agreed routing config. Keys: %s
(SageMaker's %s work too).

`, strings.Join(settingNames(false), ", "), strings.Join(settingNames(true), ", "))
		fs.PrintDefaults()
	}
	rest, c, err := actionArgs(fs, args, opts)
	if err != nil {
		return err
	}
	var out any
	switch rest[0] {
	case "get":
		out, err = c.Config(ctx)
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
			val, err := settingValue(k, v)
			if err != nil {
				return fmt.Errorf("config set: %w", err)
			}
			patch[k] = val
		}
		out, err = c.PatchConfig(ctx, patch)
	default:
		return fmt.Errorf("config: unknown action %q (want get or set)", rest[0])
	}
	if err != nil {
		return err
	}
	return printJSON(stdout, out)
}

// settingNames lists the routing settings' admin API names, or their
// SageMaker aliases.
func settingNames(sageMaker bool) []string {
	var out []string
	for _, info := range ring.SettingsInfo() {
		switch {
		case !sageMaker:
			out = append(out, info.JSON)
		case info.SageMaker != "":
			out = append(out, info.SageMaker)
		}
	}
	return out
}

// settingValue types a command-line value as the routing setting key
// takes it: an integer, a finite number, true or false (any case; not 1
// or t), or a strategy name. A value of the wrong type is an error here,
// before anything is sent.
func settingValue(key, v string) (any, error) {
	info, ok := ring.LookupSetting(key)
	if !ok {
		return nil, fmt.Errorf("unknown setting %q (want one of %s)", key, strings.Join(settingNames(false), ", "))
	}
	var s ring.Settings
	switch p := s.Field(info).(type) {
	case *int:
		i, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: want an integer", key, v)
		}
		return i, nil
	case *float64:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("%s=%q: want a number", key, v)
		}
		return f, nil
	case *bool:
		switch strings.ToLower(v) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, fmt.Errorf("%s=%q: want true or false", key, v)
	case textSetting:
		if err := p.UnmarshalText([]byte(v)); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", key, v, err)
		}
		b, _ := p.MarshalText()
		return string(b), nil
	default:
		return nil, fmt.Errorf("setting %s: no command-line form for %T", key, p)
	}
}
