package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// Status returns what GET /status serves.
func (s *Server) Status() Status {
	r, epoch := s.cfg.Router.Ring()
	routing := r.Config().Settings
	routing.PartitionCount = r.Partitions() // what 0 (automatic) chose
	st := Status{
		Node:    s.cfg.Name,
		Epoch:   epoch,
		Routing: routing,
		Ready:   s.cfg.Router.Ready(),
		Splits:  s.cfg.Router.Splits(),

		MovedPartitions: r.Moved(),
	}
	for _, b := range s.cfg.Router.Status() {
		st.Backends = append(st.Backends, BackendLiveView{BackendStatus: b, Engine: s.engine(b.ID)})
	}
	for _, b := range st.Backends {
		st.Cache = proxy.SumCache(st.Cache, b.Cache)
	}
	raft := s.cfg.Agreement.Status()
	st.Raft = &raft
	if s.cfg.Members != nil {
		st.Members = s.cfg.Members.Members()
		for i, m := range st.Members {
			if _, ok := refusedAs(raft.Refused, m.Name, m.Meta.RaftAddr); ok {
				st.Members[i].State = MemberRefused
			}
		}
	}
	if err := s.cfg.Agreement.Halted(); err != nil {
		st.Halted = err.Error()
	}
	return st
}

// engine returns the figures backend's engine last reported, or nil.
func (s *Server) engine(backend string) *EngineFigures {
	if s.cfg.Engines == nil {
		return nil
	}
	es, ok := s.cfg.Engines.Engine(backend)
	if !ok {
		return nil
	}
	return engineFigures(es)
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Status())
}

// handleExplain answers "where would this request go, and why": POST the
// body and headers a client would send, to /debug/route/v1/chat/completions
// (or ?api=chat|completions|invocations).
func (s *Server) handleExplain(w http.ResponseWriter, r *http.Request) {
	api, err := explainAPI(r.PathValue("path"), r.URL.Query().Get("api"))
	if err != nil {
		writeJSONError(w, http.StatusNotFound, "not_found", err.Error())
		return
	}
	body, ok := readBody(w, r, maxExplainBody)
	if !ok {
		return
	}
	var tenant []byte
	if vs, ok := r.Header[http.CanonicalHeaderKey(proxy.HeaderTenant)]; ok && len(vs) > 0 {
		tenant = []byte(vs[0])
	}
	rg, epoch := s.cfg.Router.Ring()
	var session []byte
	if h := rg.Config().SessionHeader; h != "" {
		if vs, ok := r.Header[http.CanonicalHeaderKey(string(h))]; ok && len(vs) > 0 {
			session = []byte(vs[0])
		}
	}
	info, e, err := s.cfg.Router.ExplainSession(api, body, tenant, session)
	if err != nil {
		code := "invalid_request"
		switch {
		case errors.Is(err, ring.ErrMalformedJSON):
			code = "invalid_json"
		case errors.Is(err, ring.ErrBadSession):
			code = "invalid_session_id"
		}
		writeJSONError(w, http.StatusBadRequest, code, err.Error())
		return
	}
	out := Explanation{
		Node: s.cfg.Name, Epoch: epoch, API: api.String(), Key: fmt.Sprintf("%016x", info.Key),
		PrefixBytes: info.PrefixBytes, Model: string(info.Model), Explanation: e,
	}
	switch {
	case info.TenantFromHeader:
		out.TenantSource = "header"
	case len(info.Tenant) > 0:
		out.TenantSource = "prompt_cache_key"
	}
	if info.Session {
		out.KeySource = "session"
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
	case "embeddings", "v1/embeddings":
		return ring.Embeddings, nil
	case "responses", "v1/responses":
		return ring.Responses, nil
	case "rerank", "v1/rerank", "v2/rerank":
		return ring.Rerank, nil
	case "score", "v1/score":
		return ring.Score, nil
	case "tokenize":
		return ring.Tokenize, nil
	case "detokenize":
		return ring.Detokenize, nil
	}
	return 0, fmt.Errorf("unknown API %q (want v1/chat/completions, v1/completions, invocations, v1/responses, v1/embeddings, v1/rerank, v1/score, tokenize or detokenize)", p)
}

// backendViews is every agreed backend with this router's live view.
func (s *Server) backendViews() BackendList {
	st, epoch := s.cfg.Agreement.State()
	live := map[string]proxy.BackendStatus{}
	for _, b := range s.cfg.Router.Status() {
		live[b.ID] = b
	}
	out := BackendList{Epoch: epoch, Backends: make([]BackendView, len(st.Backends))}
	for i, b := range st.Backends {
		v := &out.Backends[i]
		v.Backend = b
		if l, ok := live[b.ID]; ok {
			v.Live = &l
		}
		if s.cfg.Members != nil {
			v.FailingOn = s.cfg.Members.Failing(b.ID)
		}
		v.Engine = s.engine(b.ID)
	}
	return out
}

func (s *Server) handleListBackends(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.backendViews())
}

func (s *Server) handleGetBackend(w http.ResponseWriter, r *http.Request) {
	list := s.backendViews()
	for _, b := range list.Backends {
		if b.ID == r.PathValue("id") {
			writeJSON(w, http.StatusOK, BackendDoc{Epoch: list.Epoch, Backend: b})
			return
		}
	}
	writeJSONError(w, http.StatusNotFound, "unknown_backend", fmt.Sprintf("no backend %q", r.PathValue("id")))
}

func (s *Server) handleUpsertBackend(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, maxBody)
	if !ok {
		return
	}
	var req BackendRequest
	err := decodeStrict(body, &req)
	var b cluster.Backend
	if err == nil {
		b, err = s.cfg.ParseBackend(req)
	}
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_backend", err.Error())
		return
	}
	s.write(w, r, body, cluster.UpsertBackend(b))
}

func (s *Server) handleRemoveBackend(w http.ResponseWriter, r *http.Request) {
	s.write(w, r, nil, cluster.RemoveBackend(r.PathValue("id")))
}

func (s *Server) handleBackendState(w http.ResponseWriter, r *http.Request) {
	var state string
	switch r.PathValue("action") {
	case "drain":
		state = cluster.StateDraining
	case "activate", "undrain":
		state = cluster.StateActive
	case "down":
		state = cluster.StateDown
	default:
		writeJSONError(w, http.StatusNotFound, "not_found", "unknown backend action "+r.PathValue("action")+" (want drain, activate or down)")
		return
	}
	s.write(w, r, nil, cluster.SetBackendState(r.PathValue("id"), state))
}

func (s *Server) handleGetConfig(w http.ResponseWriter, r *http.Request) {
	st, epoch := s.cfg.Agreement.State()
	writeJSON(w, http.StatusOK, ConfigDoc{Epoch: epoch, Routing: st.Routing})
}

func (s *Server) handlePatchConfig(w http.ResponseWriter, r *http.Request) { s.setConfig(w, r, false) }
func (s *Server) handlePutConfig(w http.ResponseWriter, r *http.Request)   { s.setConfig(w, r, true) }

func (s *Server) setConfig(w http.ResponseWriter, r *http.Request, replace bool) {
	body, ok := readBody(w, r, maxBody)
	if !ok {
		return
	}
	st, _ := s.cfg.Agreement.State()
	rt, err := ParseRoutingPatch(st.Routing, body, replace)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_config", err.Error())
		return
	}
	s.write(w, r, body, cluster.SetRouting(rt))
}

// Cluster returns what GET /v1/cluster serves.
func (s *Server) Cluster() ClusterView {
	_, epoch := s.cfg.Agreement.State()
	v := ClusterView{Node: s.cfg.Name, Epoch: epoch, Raft: s.cfg.Agreement.Status()}
	v.Leader = v.Raft.LeaderID
	if s.cfg.Members != nil {
		for _, m := range s.cfg.Members.Members() {
			mv := MemberView{Name: m.Name, Addr: m.Addr, State: m.State, Zone: m.Meta.Zone,
				AdminAddr: m.Meta.AdminAddr, RaftAddr: m.Meta.RaftAddr, Version: m.Meta.Version}
			if reason, ok := refusedAs(v.Raft.Refused, m.Name, m.Meta.RaftAddr); ok {
				mv.State, mv.Reason = MemberRefused, reason
			}
			v.Members = append(v.Members, mv)
		}
	}
	return v
}

// refusedAs returns why this router's identity probe refuses member name
// at Raft address addr, if it does.
func refusedAs(refused []cluster.Refusal, name, addr string) (string, bool) {
	for _, r := range refused {
		if r.Name == name && r.Addr == addr {
			return r.Reason, true
		}
	}
	return "", false
}

func (s *Server) handleRevocations(w http.ResponseWriter, r *http.Request) {
	st, epoch := s.cfg.Agreement.State()
	writeJSON(w, http.StatusOK, Revocations{Epoch: epoch, Names: nonNil(st.RevokedNames), Serials: nonNil(st.RevokedSerials)})
}

// nonNil makes an empty list encode as [] (not null).
func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

// handleRevoke adds to the revocation list (POST) or takes off it
// (DELETE). The names and serial numbers are checked by the state
// machine (cluster.Revoke); a bad one answers 400.
func (s *Server) handleRevoke(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, maxBody)
	if !ok {
		return
	}
	var req RevocationRequest
	if err := decodeStrict(body, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_revocation", err.Error())
		return
	}
	cmd := cluster.Revoke(req.Names, req.Serials)
	if r.Method == http.MethodDelete {
		cmd = cluster.Unrevoke(req.Names, req.Serials)
	}
	s.write(w, r, body, cmd)
}

func (s *Server) handleCluster(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Cluster())
}
