package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// maxExplainBody bounds what /debug/route reads.
const maxExplainBody = 64 << 20

func (n *Node) adminHandler() http.Handler {
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{Registry: n.reg})
	if n.cfg.Admin.PublicMetrics {
		mux.Handle("GET /metrics", metrics)
	} else {
		mux.Handle("GET /metrics", n.guarded(false, metrics.ServeHTTP))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /status", n.guarded(false, n.handleStatus))
	mux.HandleFunc("POST /debug/route", n.guarded(false, n.handleExplain))
	mux.HandleFunc("POST /debug/route/{path...}", n.guarded(false, n.handleExplain))
	n.registerAdminAPI(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, http.StatusNotFound, "not_found", "unknown admin route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(proxy.ErrorBody(status, code, msg))
}

// Status is the /status document.
type Status struct {
	Node     string                `json:"node"`
	Epoch    uint64                `json:"epoch"`
	Routing  ring.Settings         `json:"routing"`
	Ready    bool                  `json:"ready"`
	Backends []proxy.BackendStatus `json:"backends"`
	Members  []gossip.Member       `json:"members,omitempty"`
	Raft     *cluster.Status       `json:"raft,omitempty"`
	// Halted says why this router stopped applying the Raft log, when it
	// did (it is then not ready).
	Halted string `json:"halted,omitempty"`
}

func (n *Node) status() Status {
	r, epoch := n.proxy.Ring()
	routing := r.Config().Settings
	routing.PartitionCount = r.Partitions() // what 0 (automatic) chose
	return Status{
		Node:     n.name,
		Epoch:    epoch,
		Routing:  routing,
		Ready:    n.proxy.Ready(),
		Backends: n.proxy.Status(),
		Members:  n.members(),
		Raft:     n.raftStatus(),
		Halted:   errString(n.agree.Halted()),
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (n *Node) raftStatus() *cluster.Status {
	if n.agree == nil {
		return nil
	}
	s := n.agree.Status()
	return &s
}

func (n *Node) members() []gossip.Member {
	if n.gossip == nil {
		return nil
	}
	return n.gossip.Members()
}

func (n *Node) handleStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.status())
}

// Explanation is the /debug/route answer.
type Explanation struct {
	Node         string `json:"node"`
	Epoch        uint64 `json:"epoch"`
	API          string `json:"api"`
	Key          string `json:"key"`
	PrefixBytes  int    `json:"prefix_bytes"`
	Model        string `json:"model,omitempty"`
	TenantSource string `json:"tenant_source,omitempty"`
	ring.Explanation
}

// handleExplain answers "where would this request go, and why": POST the
// body and headers a client would send, to /debug/route/v1/chat/completions
// (or ?api=chat|completions|invocations).
func (n *Node) handleExplain(w http.ResponseWriter, r *http.Request) {
	api, err := explainAPI(r.PathValue("path"), r.URL.Query().Get("api"))
	if err != nil {
		writeJSONError(w, http.StatusNotFound, "not_found", err.Error())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExplainBody))
	if err != nil {
		writeJSONError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
		return
	}
	var tenant []byte
	if vs, ok := r.Header[http.CanonicalHeaderKey(proxy.HeaderTenant)]; ok && len(vs) > 0 {
		tenant = []byte(vs[0])
	}
	_, epoch := n.proxy.Ring()
	info, e, err := n.proxy.Explain(api, body, tenant)
	if err != nil {
		code := "invalid_request"
		if errors.Is(err, ring.ErrMalformedJSON) {
			code = "invalid_json"
		}
		writeJSONError(w, http.StatusBadRequest, code, err.Error())
		return
	}
	out := Explanation{
		Node: n.name, Epoch: epoch, API: api.String(), Key: fmt.Sprintf("%016x", info.Key),
		PrefixBytes: info.PrefixBytes, Model: string(info.Model), Explanation: e,
	}
	switch {
	case info.TenantFromHeader:
		out.TenantSource = "header"
	case len(info.Tenant) > 0:
		out.TenantSource = "prompt_cache_key"
	}
	writeJSON(w, http.StatusOK, out)
}

func explainAPI(path, q string) (ring.API, error) {
	p := strings.Trim(path, "/")
	if p == "" {
		p = q
	}
	switch p {
	case "", "chat", "v1/chat/completions":
		return ring.Chat, nil
	case "completions", "v1/completions":
		return ring.Completions, nil
	case "invocations":
		return ring.Invocations, nil
	}
	return 0, fmt.Errorf("unknown API %q (want v1/chat/completions, v1/completions or invocations)", p)
}
