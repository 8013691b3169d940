package main

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// TestE2EAdminCLIOverTLS: reaching a router with cluster TLS from the CLI
// gave errors that named neither https:// nor --ca-file, one blaming a
// missing IP SAN (before). Every hint now names https:// and --ca-file,
// and the token on a 401; a bare host:port with --ca-file is https.
func TestE2EAdminCLIOverTLS(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	pki := newClusterPKI(t)
	token := writeSecret(t, "admin.token", "s3cret-admin-token")
	r := spawnRouter(t, proc.ServeArgs{NodeName: "r1", Backends: []string{e.srv.URL}, BootstrapExpect: 1,
		ClusterTLS: pki.files(t, "r1"), AdminTokenFile: token})
	if err := r.waitReady(); err != nil {
		t.Fatalf("%v\n%s", err, r.Logs())
	}
	plain := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}})
	other := newClusterPKI(t)
	host := strings.TrimPrefix(r.admin, "https://")
	plainHost := strings.TrimPrefix(plain.admin, "http://")
	closed := freeAddr(t)

	tlsHint := []string{"https://", "--ca-file"}
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"bare host:port", []string{"status", "--admin", host}, 1, append([]string{"speaks HTTPS", "--admin https://" + host}, tlsHint...)},
		{"http://", []string{"status", "--admin", "http://" + host}, 1, append([]string{"--admin https://" + host}, tlsHint...)},
		{"https:// without --ca-file", []string{"status", "--admin", "https://" + host}, 1, append([]string{"needs no IP SAN"}, tlsHint...)},
		{"https:// with another CA", []string{"status", "--admin", "https://" + host, "--ca-file", other.ca}, 1, append([]string{"not of the CA in --ca-file"}, tlsHint...)},
		{"--ca-file over http://", []string{"status", "--admin", "http://" + host, "--ca-file", pki.ca}, 2, append([]string{"use https://" + host}, tlsHint...)},
		{"https:// to a router without TLS", []string{"status", "--admin", "https://" + plainHost}, 1, append([]string{"--admin http://" + plainHost}, tlsHint...)},
		{"nobody listening", []string{"status", "--admin", closed}, 1, append([]string{"cannot reach the admin API", "--admin-listen"}, tlsHint...)},
		{"a write without the token", []string{"backends", "drain", e.addr(), "--admin", "https://" + host, "--ca-file", pki.ca}, 1,
			append([]string{"HTTP 401", "--token-file"}, tlsHint...)},
		{"a bare host:port with --ca-file is https", []string{"status", "--admin", host, "--ca-file", pki.ca}, 0, []string{"node r1", "leader r1"}},
		{"a write with the token", []string{"backends", "activate", e.addr(), "--admin", host, "--ca-file", pki.ca, "--token-file", token}, 0,
			[]string{`"node": "r1"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLIExit(t, nil, c.args...)
			if code != c.code {
				t.Errorf("%v: exit %d, want %d\n%s", c.args, code, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("%v: the output does not say %q:\n%s", c.args, w, out)
				}
			}
		})
	}
}

// TestE2ERouteExplainCLI: `warmroute route explain` asks one router, the
// routers listed or every member where a request would go; the routers
// agree, and the pick is the backend the request then reaches.
func TestE2ERouteExplainCLI(t *testing.T) {
	t.Parallel()
	needCluster(t)
	var urls []string
	for range 4 {
		urls = append(urls, newEngine(t, 0, 0, 1).srv.URL)
	}
	ps := startProcCluster(t, urls, 3)
	body := `{"model":"m","messages":[{"role":"user","content":"route explain end to end"}]}`
	admins := []string{ps[0].admin, ps[1].admin, ps[2].admin}

	// One router: the table names the pick.
	out, code := runCLIExit(t, nil, "route", "explain", "--admin", ps[1].admin, "--data", body)
	if code != 0 || !strings.Contains(out, "<- picked") || !strings.Contains(out, "affinity") {
		t.Fatalf("route explain: exit %d\n%s", code, out)
	}

	// Every router listed, the body on stdin, as JSON.
	cmd := exec.Command(binPath, "route", "explain", "/v1/chat/completions", "-o", "json", "--admin", strings.Join(admins, ","))
	cmd.Stdin = strings.NewReader(body)
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("route explain -o json: %v\n%s", err, raw)
	}
	var answers []struct {
		Admin       string `json:"admin"`
		Explanation struct {
			Node      string `json:"node"`
			Epoch     uint64 `json:"epoch"`
			Partition int    `json:"partition"`
			Backend   string `json:"backend"`
			Reason    string `json:"reason"`
		} `json:"explanation"`
	}
	if err := json.Unmarshal(raw, &answers); err != nil || len(answers) != 3 {
		t.Fatalf("%d answers (%v):\n%s", len(answers), err, raw)
	}
	pick := answers[0].Explanation.Backend
	for _, a := range answers {
		x := a.Explanation
		if x.Node == "" || x.Epoch != answers[0].Explanation.Epoch || x.Partition != answers[0].Explanation.Partition || x.Backend != pick {
			t.Errorf("answers differ: %+v", answers)
		}
	}
	// The request itself reaches the backend explained.
	for _, p := range ps {
		resp, _ := postChat(t, p.url, body)
		if got := resp.Header.Get("X-Warmroute-Backend"); resp.StatusCode != http.StatusOK || got != pick {
			t.Errorf("%s routed to %q (%d), explained %q", p.name, got, resp.StatusCode, pick)
		}
	}

	// --all finds the members from one router, and says they agree.
	out, code = runCLIExit(t, nil, "route", "explain", "--all", "--admin", ps[2].admin, "--data", body, "--tenant", "acme")
	if code != 0 || !strings.Contains(out, "agree: 3 routers route this request on the same ring") || strings.Count(out, "tenant from header") != 3 {
		t.Fatalf("route explain --all: exit %d\n%s", code, out)
	}

	// Mistakes are usage errors with the way out.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"route", "explain", "--admin", ps[0].admin, "--data", body, "--body", "x.json"}, "not both"},
		{[]string{"route", "explain", "--admin", ps[0].admin, "-H", "no colon", "--data", body}, "want 'Name: value'"},
		{[]string{"route", "explain", "--admin", ps[0].admin, "--session", "s1", "--data", body}, "session_header"},
		{[]string{"route", "show"}, "want explain"},
	} {
		if out, code := runCLIExit(t, nil, c.args...); code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want 2 naming %q:\n%s", c.args, code, c.want, out)
		}
	}
}
