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
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/proxy"
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

// caHint names where the cluster CA certificate comes from, for hints.
const caHint = "--ca-file set to the cluster CA certificate (the file every router has as --cluster-tls-ca-file; or WARMROUTE_ADMIN_CA_FILE)"

// adminHint adds to an admin API error what to do about it, in the
// flags' words: a router with cluster TLS serves its admin API over
// https:// only, verified with --ca-file; a 401 wants the token. Other
// errors pass unchanged.
func adminHint(err error) error {
	var ce *admin.ConnError
	var ae *admin.APIError
	switch {
	case errors.Is(err, admin.ErrCAOverHTTP):
		return usageError{fmt.Errorf("--ca-file: %w", err)}
	case errors.As(err, &ce):
		host := ce.URL[strings.Index(ce.URL, "://")+3:]
		switch ce.Kind {
		case admin.ConnNeedsHTTPS:
			return fmt.Errorf("%w: its router has cluster TLS, so use --admin https://%s and %s", err, host, caHint)
		case admin.ConnNeedsHTTP:
			return fmt.Errorf("%w: its router has no cluster TLS, so use --admin http://%s without --ca-file (https:// and --ca-file are for routers with cluster TLS)", err, host)
		case admin.ConnUnverified:
			if ce.CA {
				return fmt.Errorf("%w: the certificate is not of the CA in --ca-file; keep https:// and give %s", err, caHint)
			}
			return fmt.Errorf("%w: a router's cluster certificate names the router, not a host or IP address (it needs no IP SAN), and is verified against the cluster CA alone: keep https:// and add %s", err, caHint)
		}
		return fmt.Errorf("%w: check --admin (or WARMROUTE_ADMIN_URL), the router's --admin-listen address: http://host:port, or https://host:port with %s for routers with cluster TLS", err, caHint)
	case errors.As(err, &ae) && ae.Status == http.StatusUnauthorized:
		return fmt.Errorf("%w: pass the admin token with --token-file (or WARMROUTE_ADMIN_TOKEN_FILE, or WARMROUTE_ADMIN_TOKEN); routers with cluster TLS take it over https:// with %s, so it never crosses the network in clear", err, caHint)
	}
	return err
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

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	defer func() { err = adminHint(err) }()
	fs := flag.NewFlagSet("warmroute status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print the raw JSON (same as -o json)")
	output := outputFlag(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: warmroute status [flags]\n\nShow the cluster: members, Raft leader and voters, ring epoch, and each backend's state, health,\nload and engine figures (KV-cache use, running and queued requests, prefix-cache hit rate), and\nthis router's cache predictions against what the answers delivered, per decision kind.\n\n")
		fs.PrintDefaults()
	}
	rest, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("status takes no arguments, got %q", rest)
	}
	if err := checkOutput(*output); err != nil {
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
	if *asJSON || *output == "json" {
		return printJSON(stdout, map[string]any{"cluster": cl, "backends": bs.Backends})
	}
	raft := cl.Raft
	fmt.Fprintf(stdout, "node %v  epoch %v  raft %v  leader %v  term %v\n", cl.Node, cl.Epoch, raft.RaftState, raft.LeaderID, raft.Term)
	if len(raft.Servers) > 0 {
		fmt.Fprintln(stdout)
		tw := newTable(stdout)
		fmt.Fprintln(tw, "RAFT SERVER\tADDRESS\tVOTER")
		for _, s := range raft.Servers {
			fmt.Fprintf(tw, "%v\t%v\t%v\n", s.ID, s.Addr, s.Voter)
		}
		tw.Flush()
	}
	if len(cl.Members) > 0 {
		fmt.Fprintln(stdout)
		tw := newTable(stdout)
		fmt.Fprintln(tw, "MEMBER\tSTATE\tZONE\tADMIN")
		for _, m := range cl.Members {
			state := m.State
			if m.Reason != "" {
				state += " (" + m.Reason + ")" // refused: why
			}
			fmt.Fprintf(tw, "%v\t%v\t%v\t%v\n", m.Name, state, orDash(m.Zone), m.AdminAddr)
		}
		tw.Flush()
	}
	fmt.Fprintln(stdout)
	if err := backendTable(stdout, bs.Backends); err != nil {
		return err
	}
	return cacheTable(stdout, bs.Backends)
}

// cacheTable writes this router's cache predictions per decision kind,
// summed over the backends, when it answered any keyed request.
func cacheTable(w io.Writer, bs []admin.BackendView) error {
	var sum []proxy.CacheFigures
	for _, b := range bs {
		if b.Live != nil {
			sum = proxy.SumCache(sum, b.Live.Cache)
		}
	}
	if len(sum) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "DECISION KIND\tANSWERS\tWITH USAGE\tPREDICTED WARM\tDELIVERED WARM\tBOTH WARM\tTOKENS CACHED")
	for _, f := range sum {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\t%v\n", f.Kind, f.Answers, f.Reported,
			ofReported(f.PredictedWarm, f), ofReported(f.DeliveredWarm, f), f.BothWarm, cacheRate(f.TokenHitRate, f.PromptTokens))
	}
	return tw.Flush()
}

// ofReported writes n answers and their share of those with a usage
// report.
func ofReported(n int64, f proxy.CacheFigures) string {
	if f.Reported == 0 {
		return "-"
	}
	return fmt.Sprintf("%d (%.1f%%)", n, 100*float64(n)/float64(f.Reported))
}

// cacheRate writes a rate as a percentage, "-" when nothing was counted.
func cacheRate(r float64, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*r)
}

// newTable returns a writer that aligns tab-separated columns.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// backendTable writes one line per backend: the agreed record, this
// router's live view and the engine's figures ("-" for what is unknown).
// WARM PRED/DELIV is the share of this router's answers from the backend
// (with a usage report) that it predicted warm, and that were delivered
// warm.
func backendTable(w io.Writer, bs []admin.BackendView) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "BACKEND\tSTATE\tHEALTHY\tIN-FLIGHT\tLIMIT\tZONE\tKV USED\tRUNNING\tWAITING\tHIT RATE\tWARM PRED/DELIV\tURL")
	for _, b := range bs {
		inflight, healthy, limit, warm := "-", "-", "-", "-"
		if l := b.Live; l != nil {
			var all proxy.CacheFigures
			for _, f := range l.Cache {
				all.Add(f)
			}
			if all.Reported > 0 {
				warm = fmt.Sprintf("%.0f%%/%.0f%%", 100*all.PredictedHitRate, 100*all.DeliveredHitRate)
			}
			inflight = fmt.Sprintf("%v+%v", l.InFlight, l.RemoteInFlight)
			healthy = fmt.Sprint(l.Healthy)
			if len(b.FailingOn) > 0 {
				healthy += " (failing on " + strings.Join(b.FailingOn, ",") + ")"
			}
			limit = fmt.Sprint(l.Limit)
		}
		kv, running, waiting, hit := engineTexts(b.Engine)
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\n",
			b.ID, b.State, healthy, inflight, limit, orDash(b.Zone), kv, running, waiting, hit, warm, b.URL)
	}
	return tw.Flush()
}

// engineTexts formats an engine's figures: KV-cache use and hit rate as
// percentages, requests as counts; "-" when the engine does not report
// one, "scrape failed" in the first column when its last scrape failed.
func engineTexts(e *admin.EngineFigures) (kv, running, waiting, hit string) {
	if e == nil {
		return "-", "-", "-", "-"
	}
	if !e.OK {
		return "scrape failed", "-", "-", "-"
	}
	pct := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100**v)
	}
	count := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(*v, 'f', -1, 64)
	}
	return pct(e.KVUsage), count(e.Running), count(e.Waiting), pct(e.PrefixHitRate)
}

// outputFlag binds -o (--output): table or json.
func outputFlag(fs *flag.FlagSet) *string {
	o := fs.String("output", "table", "output format: table, or json for scripts")
	fs.StringVar(o, "o", "table", "shorthand for --output")
	return o
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return usageErrorf("--output %q: want table or json", o)
	}
	return nil
}

// actionArgs parses an admin command's flags, which may come before or
// after the action and its arguments, and returns the action and arguments
// and the admin client; an action is required.
func actionArgs(fs *flag.FlagSet, args []string, opts adminOpts) ([]string, *admin.Client, error) {
	rest, err := parseArgs(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if len(rest) == 0 {
		fs.Usage()
		return nil, nil, usageErrorf("%s: missing action", strings.TrimPrefix(fs.Name(), "warmroute "))
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

func cmdBackends(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	defer func() { err = adminHint(err) }()
	fs := flag.NewFlagSet("warmroute backends", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := adminFlags(fs)
	id := fs.String("id", "", "add: backend id (default host:port of the URL)")
	zone := fs.String("zone", "", "add: availability zone")
	weight := fs.Int("weight", 0, "add: weight (scales the concurrency limit)")
	output := outputFlag(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: warmroute backends [flags] list
       warmroute backends [flags] add URL
       warmroute backends [flags] remove|drain|activate|down ID

Change the agreed backend set through any router; the change is committed
through Raft and every router rebuilds its ring at the same epoch. Flags may
also follow the action ('backends add URL --zone a'). 'list' prints a table,
or JSON with -o json; the other actions print the JSON answer.

`)
		fs.PrintDefaults()
	}
	rest, c, err := actionArgs(fs, args, opts)
	if err != nil {
		return err
	}
	if err := checkOutput(*output); err != nil {
		return err
	}
	need := func(n int) error {
		if len(rest) != n+1 {
			return usageErrorf("backends %s: want %d argument(s), got %d", rest[0], n, len(rest)-1)
		}
		return nil
	}
	var out any
	switch rest[0] {
	case "list", "ls":
		if err := need(0); err != nil {
			return err
		}
		list, err := c.Backends(ctx)
		if err != nil {
			return err
		}
		if *output == "json" {
			return printJSON(stdout, list)
		}
		fmt.Fprintf(stdout, "epoch %d\n\n", list.Epoch)
		return backendTable(stdout, list.Backends)
	case "add":
		if err := need(1); err != nil {
			return err
		}
		out, err = c.AddBackend(ctx, admin.BackendRequest{URL: rest[1], ID: *id, Zone: *zone, Weight: *weight})
	case "remove", "rm":
		if err := need(1); err != nil {
			return err
		}
		out, err = c.RemoveBackend(ctx, rest[1])
	case "drain", "activate", "undrain", "down":
		if err := need(1); err != nil {
			return err
		}
		out, err = c.SetBackendState(ctx, rest[1], rest[0])
	default:
		return usageErrorf("backends: unknown action %q (want list, add, remove, drain, activate or down)", rest[0])
	}
	if err != nil {
		return err
	}
	return printJSON(stdout, out)
}

func cmdConfig(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	defer func() { err = adminHint(err) }()
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
			return usageErrorf("config set: want key=value (e.g. prefix_length=8192)")
		}
		patch := map[string]any{}
		for _, kv := range rest[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageErrorf("config set: %q is not key=value (e.g. prefix_length=8192)", kv)
			}
			val, err := settingValue(k, v)
			if err != nil {
				return usageErrorf("config set: %w", err)
			}
			patch[k] = val
		}
		out, err = c.PatchConfig(ctx, patch)
	default:
		return usageErrorf("config: unknown action %q (want get or set)", rest[0])
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
// before anything is sent, naming the setting, the type it takes and an
// example (its default).
func settingValue(key, v string) (any, error) {
	info, ok := ring.LookupSetting(key)
	if !ok {
		names := settingNames(false)
		if c := closest(key, append(names, settingNames(true)...)); c != "" {
			return nil, fmt.Errorf("unknown setting %q (did you mean %s?)", key, c)
		}
		return nil, fmt.Errorf("unknown setting %q (want one of %s)", key, strings.Join(names, ", "))
	}
	def := ring.DefaultSettings()
	bad := func(what string, cause error) error {
		ex := fmt.Sprintf("%s=%v", key, reflectValue(def.Field(info)))
		if cause != nil {
			return fmt.Errorf("%s=%q: %v; %s takes %s, e.g. %s", key, v, cause, key, what, ex)
		}
		return fmt.Errorf("%s=%q: %s takes %s, e.g. %s", key, v, key, what, ex)
	}
	var s ring.Settings
	switch p := s.Field(info).(type) {
	case *int:
		i, err := strconv.Atoi(v)
		if err != nil {
			return nil, bad("an integer", nil)
		}
		return i, nil
	case *float64:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, bad("a finite number", nil)
		}
		return f, nil
	case *bool:
		switch strings.ToLower(v) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, bad("true or false", nil)
	case textSetting:
		if err := p.UnmarshalText([]byte(v)); err != nil {
			return nil, bad("a name", err)
		}
		b, _ := p.MarshalText()
		return string(b), nil
	default:
		return nil, fmt.Errorf("setting %s: no command-line form for %T", key, p)
	}
}

// reflectValue is the value a setting's field points to, as text.
func reflectValue(p any) any {
	switch p := p.(type) {
	case *int:
		return *p
	case *float64:
		return *p
	case *bool:
		return *p
	case textSetting:
		b, _ := p.MarshalText()
		return string(b)
	}
	return p
}
