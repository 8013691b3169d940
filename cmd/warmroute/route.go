package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/proxy"
)

// Bounds of what `route explain` sends and asks.
const (
	// maxExplainRouters bounds the routers one command asks.
	maxExplainRouters = 64
	// maxExplainHeaders bounds the -H headers.
	maxExplainHeaders = 64
	// maxExplainBodyBytes is what the route explainer reads of a body.
	maxExplainBodyBytes = 64 << 20
)

// errDisagree: the routers asked do not route the request on the same
// ring.
var errDisagree = errors.New("the routers do not agree")

// headerFlag collects repeated -H 'Name: value' flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || name == "" {
		return fmt.Errorf("%q: want 'Name: value'", v)
	}
	if !validHeaderName(name) || strings.ContainsAny(value, "\r\n\x00") {
		return fmt.Errorf("%q: not a valid header", v)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	if len(f.h) >= maxExplainHeaders {
		return fmt.Errorf("at most %d headers", maxExplainHeaders)
	}
	f.h.Add(name, value)
	return nil
}

// validHeaderName reports whether s is an HTTP token.
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}

func cmdRoute(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	defer func() { err = adminHint(err) }()
	fs := flag.NewFlagSet("warmroute route", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := adminFlags(fs)
	fs.Lookup("admin").Usage = "the admin URL of a router to ask, or several, comma-separated, to compare their answers; or WARMROUTE_ADMIN_URL"
	bodyFile := fs.String("body", "", "file holding the request body, or - for stdin (the default when stdin is not a terminal)")
	data := fs.String("data", "", "the request body itself (instead of --body)")
	fs.StringVar(data, "d", "", "shorthand for --data")
	var headers headerFlag
	fs.Var(&headers, "H", "a header the client would send, 'Name: value' (repeatable; e.g. the tenant header "+proxy.HeaderTenant+")")
	tenant := fs.String("tenant", "", "the tenant id, sent as "+proxy.HeaderTenant)
	session := fs.String("session", "", "the session id, sent in the session header the routers key on (their session_header setting)")
	all := fs.Bool("all", false, "ask every router of the cluster (the members --admin's router lists), to show they agree")
	output := outputFlag(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: warmroute route explain [flags] [PATH]

Show where a request would go and why, without sending it: the prompt prefix
hashed, the tenant and where it came from, the routing key, its partition,
the partition's candidate backends in order with their state and load, and
the backend picked with the reason (affinity, overflow, ...). PATH is the API
path a client would send to (default /v1/chat/completions; also
/v1/completions, /invocations, /v1/responses, /v1/embeddings, /v1/rerank,
/v1/score, /tokenize, /detokenize). The body comes from --body FILE, --data,
or stdin; headers from -H, --tenant and --session.

With several routers (--admin URL,URL,... or --all) each is asked and the
answers compared: routers at the same epoch route a key to the same
partition and candidates; the pick may still differ with load. The exit
status is 1 when the routers do not agree on the ring.

examples:
  warmroute route explain --data '{"model":"m","messages":[{"role":"user","content":"hi"}]}'
  warmroute route explain /v1/completions --body req.json --tenant acme --all \
      --admin https://10.0.1.11:9090 --ca-file warmroute-ca.pem --token-file admin.token

`)
		fs.PrintDefaults()
	}
	rest, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 || rest[0] != "explain" {
		fs.Usage()
		if len(rest) == 0 {
			return usageErrorf("route: missing action (want explain)")
		}
		return usageErrorf("route: unknown action %q (want explain)", rest[0])
	}
	path := "/v1/chat/completions"
	switch len(rest) {
	case 1:
	case 2:
		path = "/" + strings.TrimLeft(rest[1], "/")
	default:
		return usageErrorf("route explain: want at most one PATH, got %q", rest[1:])
	}
	if err := checkOutput(*output); err != nil {
		return err
	}
	body, err := explainBody(*bodyFile, *data)
	if err != nil {
		return err
	}
	if headers.h == nil {
		headers.h = http.Header{}
	}
	if *tenant != "" {
		if err := headers.Set(proxy.HeaderTenant + ": " + *tenant); err != nil {
			return usageErrorf("--tenant: %w", err)
		}
	}

	clients, err := explainClients(ctx, opts, *all)
	if err != nil {
		return err
	}
	if *session != "" {
		cfg, err := clients[0].Config(ctx)
		if err != nil {
			return err
		}
		h := string(cfg.Routing.SessionHeader)
		if h == "" {
			return usageErrorf("--session: the routers key on no session header (session_header is off): " +
				"turn it on with 'warmroute config set session_header=X-Session-Id', or send the header with -H")
		}
		if err := headers.Set(h + ": " + *session); err != nil {
			return usageErrorf("--session: %w", err)
		}
	}

	answers := make([]explainAnswer, len(clients))
	for i, c := range clients {
		answers[i].Admin = c.URL()
		e, err := c.Explain(ctx, path, body, headers.h)
		if err != nil {
			if len(clients) == 1 {
				return err
			}
			answers[i].Err = adminHint(err).Error()
			continue
		}
		answers[i].Explanation = &e
	}
	if *output == "json" {
		if err := printJSON(stdout, answers); err != nil {
			return err
		}
	} else {
		for i, a := range answers {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			explainTable(stdout, a)
		}
	}
	if len(answers) == 1 {
		return nil
	}
	verdict, err := agreement(answers)
	if *output != "json" {
		fmt.Fprintf(stdout, "\n%s\n", verdict)
	}
	return err
}

// explainAnswer is one router's answer, for output.
type explainAnswer struct {
	Admin       string             `json:"admin"`
	Err         string             `json:"error,omitempty"`
	Explanation *admin.Explanation `json:"explanation,omitempty"`
}

// explainBody reads the request body: --data, else the --body file (-:
// stdin), else stdin when it is not a terminal. It reads at most what the
// route explainer reads.
func explainBody(file, data string) ([]byte, error) {
	switch {
	case data != "" && file != "":
		return nil, usageErrorf("give the body with --body or with --data, not both")
	case data != "":
		return []byte(data), nil
	}
	var r io.Reader
	switch file {
	case "", "-":
		if st, err := os.Stdin.Stat(); file == "" && (err != nil || st.Mode()&os.ModeCharDevice != 0) {
			return nil, usageErrorf("no request body: give it with --body FILE, --data '{...}', or on stdin")
		}
		r = os.Stdin
	default:
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("--body: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxExplainBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	if len(b) > maxExplainBodyBytes {
		return nil, usageErrorf("the request body is over %d bytes, what the route explainer reads", maxExplainBodyBytes)
	}
	return b, nil
}

// explainClients returns a client per router to ask: each URL of --admin
// (comma-separated), or with all, every live member the first lists.
func explainClients(ctx context.Context, o adminOpts, all bool) ([]*admin.Client, error) {
	urls := strings.Split(*o.addr, ",")
	var out []*admin.Client
	for _, u := range urls {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		ou := o
		ou.addr = &u
		c, err := newAdminClient(ou)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, usageErrorf("--admin: no admin URL")
	}
	if !all {
		if len(out) > maxExplainRouters {
			return nil, usageErrorf("--admin lists %d routers, at most %d", len(out), maxExplainRouters)
		}
		return out, nil
	}
	if len(out) > 1 {
		return nil, usageErrorf("--all asks the members of one router: give --admin one URL")
	}
	cl, err := out[0].Cluster(ctx)
	if err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(out[0].URL(), "://")
	var members []string
	for _, m := range cl.Members {
		if (m.State == "alive" || m.State == "suspect") && m.AdminAddr != "" {
			members = append(members, m.AdminAddr)
		}
	}
	if len(members) == 0 {
		return out, nil // a router alone
	}
	if len(members) > maxExplainRouters {
		return nil, fmt.Errorf("the cluster lists %d routers; --all asks at most %d (list some with --admin)", len(members), maxExplainRouters)
	}
	slices.Sort(members)
	out = out[:0]
	for _, a := range members {
		u := scheme + "://" + a
		ou := o
		ou.addr = &u
		c, err := newAdminClient(ou)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// explainTable prints one router's answer.
func explainTable(w io.Writer, a explainAnswer) {
	if a.Explanation == nil {
		fmt.Fprintf(w, "%s: %s\n", a.Admin, a.Err)
		return
	}
	e := a.Explanation
	fmt.Fprintf(w, "router %s (%s)  epoch %d  api %s  strategy %s\n", e.Node, a.Admin, e.Epoch, e.API, e.Strategy)
	key := e.KeySource
	if key == "" {
		key = fmt.Sprintf("prompt, first %d bytes", e.PrefixBytes)
	}
	fmt.Fprintf(w, "key %s (%s)  partition %d", e.Key, key, e.Partition)
	if e.Model != "" {
		fmt.Fprintf(w, "  model %s", e.Model)
	}
	if e.TenantSource != "" {
		fmt.Fprintf(w, "  tenant from %s", e.TenantSource)
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "RANK\tBACKEND\tSTATE\tHEALTHY\tBUSY\tIN-FLIGHT\tLIMIT\t")
	for _, c := range e.Candidates {
		mark := ""
		if c.ID == e.Backend {
			mark = "<- picked"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%v\t%v\t%d\t%d\t%s\n", c.Rank, c.ID, c.State, c.Healthy, c.Busy, c.InFlight, c.Limit, mark)
	}
	tw.Flush()
	if e.Error != "" {
		fmt.Fprintf(w, "no pick: %s (%s)\n", e.Error, e.Reason)
		return
	}
	fmt.Fprintf(w, "pick %s: %s, rank %d\n", e.Backend, e.Reason, e.Rank)
}

// agreement compares the routers' answers: the same epoch, key,
// partition and candidate order is agreement on the ring (errDisagree
// otherwise); picks that differ under it are load, which each router sees
// a moment apart.
func agreement(as []explainAnswer) (string, error) {
	var ok []*admin.Explanation
	var failed []string
	for _, a := range as {
		if a.Explanation == nil {
			failed = append(failed, a.Admin)
			continue
		}
		ok = append(ok, a.Explanation)
	}
	if len(ok) == 0 {
		return "no router answered", errors.New("no router answered")
	}
	ring := func(e *admin.Explanation) string {
		ids := make([]string, len(e.Candidates))
		for i, c := range e.Candidates {
			ids[i] = c.ID
		}
		return fmt.Sprintf("epoch %d, key %s, partition %d, candidates %s", e.Epoch, e.Key, e.Partition, strings.Join(ids, ","))
	}
	rings := map[string][]string{}
	picks := map[string][]string{}
	for _, e := range ok {
		rings[ring(e)] = append(rings[ring(e)], e.Node)
		p := e.Backend
		if p == "" {
			p = "none"
		}
		picks[p] = append(picks[p], e.Node)
	}
	var b strings.Builder
	var err error
	if len(rings) == 1 {
		fmt.Fprintf(&b, "agree: %d routers route this request on the same ring (%s)", len(ok), ring(ok[0]))
	} else {
		err = errDisagree
		b.WriteString("DISAGREE: the routers route this request on different rings:")
		for _, r := range slices.Sorted(maps.Keys(rings)) {
			fmt.Fprintf(&b, "\n  %s: %s", strings.Join(rings[r], ", "), r)
		}
	}
	if len(picks) == 1 {
		for p := range picks {
			fmt.Fprintf(&b, "\npick: %s on every router that answered", p)
		}
	} else {
		if len(rings) == 1 {
			b.WriteString("\npicks differ with load (each router sees the others' in-flight counts a moment late):")
		} else {
			b.WriteString("\npicks:")
		}
		for _, p := range slices.Sorted(maps.Keys(picks)) {
			fmt.Fprintf(&b, " %s on %s;", p, strings.Join(picks[p], ", "))
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(&b, "\nno answer from %s", strings.Join(failed, ", "))
		if err == nil {
			err = fmt.Errorf("%d of %d routers did not answer", len(failed), len(as))
		}
	}
	return b.String(), err
}
