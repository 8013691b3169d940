package proxy

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/ring"
)

// Model-aware routing. A fleet may serve several models, and an engine
// serves each LoRA adapter it loaded as a model of its own. When the
// proxy knows what its backends serve (SetModels), a table holds one
// sub-table per model: a ring over the backends that serve it, plus the
// backends whose models are not known, so a request for a model is keyed,
// owned and overflowed among them only, the same way on every router. A
// request for a model no backend serves gets 404 model_not_found; one that
// names no model uses the whole fleet. /v1/models is answered from the
// union of what the healthy backends serve.

// modelTables holds a table's per-model sub-tables.
type modelTables struct {
	byModel map[string]*table
	// unknown: some backends' models are not known, so a model no known
	// backend serves still goes to them (the table of the unknown ones).
	unknown *table
	// served is every backend's models (nil: unknown), by table index.
	served [][]string
	// created is the time /v1/models reports for its entries.
	created int64
}

// subRingCache holds the model rings built for one fleet, settings and
// SetModels call.
type subRingCache struct {
	version  uint64
	cfg      ring.Config
	backends []ring.Backend
	rings    map[string]*ring.Ring
}

// maxModels bounds the models of one backend, and maxModelLen a model id,
// as the agreed state does.
const (
	maxModels   = 1024
	maxModelLen = 256
)

// SetModels records what each backend serves: model ids by backend id,
// adapters included (nil or absent: not known). It takes effect at once
// and survives ring changes; a backend that is not in the ring is ignored.
func (p *Proxy) SetModels(models map[string][]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.served = models
	p.servedVersion++
	if t := p.tab.Load(); t != nil {
		p.tab.Store(p.withModels(t))
	}
}

// withModels returns t, or a copy of it with model sub-tables when models
// are known for any of its backends. Call it with p.mu held.
func (p *Proxy) withModels(t *table) *table {
	out := *t
	out.models = nil
	if len(p.served) == 0 {
		return &out
	}
	rbs := t.ring.Backends()
	served := make([][]string, len(rbs))
	known := false
	all := map[string]bool{}
	for i, rb := range rbs {
		if ms, ok := p.served[rb.ID]; ok && ms != nil {
			served[i], known = ms, true
			for _, m := range ms {
				all[m] = true
			}
		}
	}
	if !known {
		return &out
	}
	mt := &modelTables{byModel: make(map[string]*table, len(all)), served: served, created: time.Now().Unix()}
	cfg := t.ring.Config()
	// The rings of the last build serve again while the fleet, its
	// settings and what it serves stay the same: a new epoch (a split, a
	// move, a health change elsewhere) does not rebuild them.
	c := &p.subRings
	if c.version != p.servedVersion || c.cfg.Settings != cfg.Settings || c.cfg.LocalZone != cfg.LocalZone || !slices.Equal(c.backends, rbs) {
		*c = subRingCache{version: p.servedVersion, cfg: cfg, backends: slices.Clone(rbs), rings: map[string]*ring.Ring{}}
	}
	sub := func(name string, keep func(i int) bool) *table {
		var bs []ring.Backend
		var own []*backend
		for i, rb := range rbs {
			if keep(i) {
				bs = append(bs, rb)
				own = append(own, t.bs[i])
			}
		}
		switch {
		case len(bs) == 0:
			return nil
		case len(bs) == len(rbs):
			return &out
		}
		r := c.rings[name]
		if r == nil {
			var err error
			if r, err = t.ring.Rebuild(cfg, bs); err != nil {
				p.log.Warn("cannot build a model's ring; its requests use the whole fleet", "model", name, "backends", len(bs), "err", err)
				return &out
			}
			c.rings[name] = r
		}
		// Backends are sorted by ID in both rings.
		return &table{ring: r, bs: own, epoch: t.epoch, epochHdr: t.epochHdr}
	}
	mt.unknown = sub("\x00unknown", func(i int) bool { return served[i] == nil })
	for m := range all {
		mt.byModel[m] = sub(m, func(i int) bool { return served[i] == nil || slices.Contains(served[i], m) })
	}
	out.models = mt
	return &out
}

// forModel returns the table a request for model (raw, as in the JSON
// string) routes on, or nil when no backend serves it.
func (t *table) forModel(model []byte) *table {
	mt := t.models
	if mt == nil || len(model) == 0 {
		return t
	}
	if mt2, ok := mt.byModel[string(model)]; ok {
		return mt2
	}
	if slices.Contains(model, '\\') {
		// An escaped id (rare): compare it decoded.
		var s string
		if json.Unmarshal(append(append([]byte{'"'}, model...), '"'), &s) == nil {
			if mt2, ok := mt.byModel[s]; ok {
				return mt2
			}
		}
	}
	return mt.unknown
}

// modelNotFound answers a request for a model no backend serves, as the
// engines do.
func modelNotFound(ctx *fasthttp.RequestCtx, model []byte) {
	writeError(ctx, fasthttp.StatusNotFound, "model_not_found", "The model `"+string(model)+"` does not exist.")
}

// modelEntry is one entry of the /v1/models answer, in the engines' shape.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// serveModels answers GET /v1/models from what the healthy backends serve,
// when that is known for every healthy backend; it reports false when the
// request must go to a backend instead.
func (p *Proxy) serveModels(ctx *fasthttp.RequestCtx, t *table) bool {
	mt := t.models
	if mt == nil {
		return false
	}
	now := time.Now().UnixNano()
	seen := map[string]bool{}
	var ids []string
	for i, b := range t.bs {
		if t.ring.Backend(i).State != ring.Active || !b.available(now) {
			continue
		}
		if mt.served[i] == nil {
			return false // a healthy backend's models are unknown: ask one
		}
		for _, m := range mt.served[i] {
			if !seen[m] {
				seen[m] = true
				ids = append(ids, m)
			}
		}
	}
	slices.Sort(ids)
	out := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: make([]modelEntry, len(ids))}
	for i, id := range ids {
		out.Data[i] = modelEntry{ID: id, Object: "model", Created: mt.created, OwnedBy: "warmroute"}
	}
	b, _ := json.Marshal(out)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.Response.Header.Set("X-Warmroute-Decision", "local")
	ctx.Response.Header.Set("X-Warmroute-Models", strconv.Itoa(len(ids)))
	ctx.SetBody(b)
	return true
}
