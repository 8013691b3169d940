package gpusim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// LoRA adapters, served the way vLLM serves them. An instance started
// with EnableLoRA serves the adapters of LoRAModules from the start, and,
// with AllowRuntimeLoRAUpdating, loads and unloads others through POST
// /v1/load_lora_adapter and /v1/unload_lora_adapter. Each adapter is a
// model of its own: /v1/models lists it with its parent (the base model)
// and its root (its path), and a request naming it as `model` is served
// with it. An adapter's prompt blocks are hashed under its name, so a
// prompt under adapter A never hits the cache of the base model or of
// adapter B (vLLM puts the adapter's name into every block's extra keys).
//
// Residency is vLLM's worker LRU caches, kept simple: MaxLoRAs GPU slots
// and MaxCPULoRAs adapters in host memory. A request for an adapter that
// holds no GPU slot takes one when it is admitted, and its prefill starts
// LoRASwapTime later, plus LoRALoadTime when the adapter was not in host
// memory either (read from disk). The running batch holds at most
// MaxLoRAs distinct adapters: a waiting request whose adapter would be
// one too many is passed over for the requests behind it, as vLLM's
// scheduler skips it. gpusim never opens an adapter's path: a path is
// only a name, echoed as the adapter's root.

// LoRAModule is one adapter served from the start: vLLM's --lora-modules
// entry, `name=path` or the JSON form
// {"name":...,"path":...,"base_model_name":...}.
type LoRAModule struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// BaseModelName is the adapter's parent; vLLM ignores a name that is
	// not one of its base models, and so does gpusim (the parent is then
	// Config.Model).
	BaseModelName string `json:"base_model_name,omitempty"`
}

// Bounds on what a client or a command line may register.
const (
	// MaxLoRAAdapters bounds the adapters one instance holds (static and
	// loaded), and MaxLoRAs and MaxCPULoRAs.
	MaxLoRAAdapters = 1024
	// MaxLoRANameBytes bounds an adapter's name (a router keeps model
	// ids of up to 256 bytes).
	MaxLoRANameBytes = 256
	// MaxLoRAPathBytes bounds an adapter's path.
	MaxLoRAPathBytes = 4096
)

// ErrBadLoRAModule wraps every --lora-modules entry that cannot be parsed.
var ErrBadLoRAModule = errors.New("gpusim: bad LoRA module")

// ParseLoRAModule parses one --lora-modules entry as vLLM does: `name=path`
// when the entry has one '=' and no ',', else a JSON object with "name",
// "path" and optionally "base_model_name".
func ParseLoRAModule(s string) (LoRAModule, error) {
	if strings.Contains(s, "=") && !strings.Contains(s, ",") {
		name, path, _ := strings.Cut(s, "=")
		if strings.Contains(path, "=") {
			return LoRAModule{}, fmt.Errorf("%w: %q: more than one '=' (use the JSON form)", ErrBadLoRAModule, s)
		}
		return LoRAModule{Name: name, Path: path}, nil
	}
	var m LoRAModule
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return LoRAModule{}, fmt.Errorf("%w: %q: not name=path nor JSON with name and path: %v", ErrBadLoRAModule, s, err)
	}
	if dec.More() {
		return LoRAModule{}, fmt.Errorf("%w: %q: text after the JSON object", ErrBadLoRAModule, s)
	}
	return m, nil
}

// checkLoRAName reports why name cannot be an adapter's name, or "".
// Names are printable ASCII, as a router accepts model ids; vLLM itself
// takes any string.
func checkLoRAName(name string) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > MaxLoRANameBytes:
		return fmt.Sprintf("is %d bytes, more than %d", len(name), MaxLoRANameBytes)
	case strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r > 0x7e }):
		return "is not printable ASCII"
	}
	return ""
}

// checkLoRAPath reports why path cannot be an adapter's path, or "".
func checkLoRAPath(path string) string {
	switch {
	case path == "":
		return "is empty"
	case len(path) > MaxLoRAPathBytes:
		return fmt.Sprintf("is %d bytes, more than %d", len(path), MaxLoRAPathBytes)
	case strings.ContainsFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "has a control character"
	}
	return ""
}

// validateLoRA checks the LoRA fields of c.
func (c Config) validateLoRA() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.MaxLoRAs < 1 || c.MaxLoRAs > MaxLoRAAdapters:
		return bad("max loras %d outside 1-%d", c.MaxLoRAs, MaxLoRAAdapters)
	case c.MaxCPULoRAs != 0 && (c.MaxCPULoRAs < c.MaxLoRAs || c.MaxCPULoRAs > MaxLoRAAdapters):
		// vLLM: max_cpu_loras must be >= max_loras.
		return bad("max cpu loras %d must be 0 (= max loras) or in %d-%d", c.MaxCPULoRAs, c.MaxLoRAs, MaxLoRAAdapters)
	case c.LoRALoadTime < 0 || c.LoRASwapTime < 0:
		return bad("LoRA load and swap times must not be negative")
	case len(c.LoRAModules) > 0 && !c.EnableLoRA:
		// vLLM fails at start: "LoRA is not enabled. Use --enable-lora to enable LoRA."
		return bad("LoRA modules need LoRA enabled (--enable-lora)")
	case len(c.LoRAModules) > MaxLoRAAdapters:
		return bad("%d LoRA modules, at most %d", len(c.LoRAModules), MaxLoRAAdapters)
	}
	seen := make(map[string]bool, len(c.LoRAModules))
	for _, m := range c.LoRAModules {
		if why := checkLoRAName(m.Name); why != "" {
			return bad("LoRA module name %q %s", m.Name, why)
		}
		if why := checkLoRAPath(m.Path); why != "" {
			return bad("LoRA module %s: path %s", m.Name, why)
		}
		if m.Name == c.Model {
			return bad("LoRA module %s has the base model's name", m.Name)
		}
		if seen[m.Name] {
			// vLLM fails at start: the adapter has already been loaded.
			return bad("LoRA module %s given twice", m.Name)
		}
		seen[m.Name] = true
	}
	return nil
}

// cpuLoRAs is how many adapters host memory holds (vLLM's default
// max_cpu_loras is max_loras).
func (c *Config) cpuLoRAs() int {
	if c.MaxCPULoRAs == 0 {
		return c.MaxLoRAs
	}
	return c.MaxCPULoRAs
}

// loraAdapter is one adapter an instance serves.
type loraAdapter struct {
	name, path string
	nameJSON   []byte // name as a JSON string, for answers
}

// loraRegistry is what an instance serves besides its base model: the
// adapters in the order they were loaded, looked up by name by every
// request. Loads in progress reserve their name.
type loraRegistry struct {
	mu      sync.RWMutex
	byName  map[string]*loraAdapter
	order   []*loraAdapter
	pending map[string]bool
}

func newLoRARegistry() *loraRegistry {
	return &loraRegistry{byName: map[string]*loraAdapter{}, pending: map[string]bool{}}
}

func newLoRAAdapter(name, path string) *loraAdapter {
	j, _ := json.Marshal(name)
	return &loraAdapter{name: name, path: path, nameJSON: j}
}

// get returns the adapter called name, or nil.
func (r *loraRegistry) get(name string) *loraAdapter {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byName[name]
}

// list returns the adapters in load order.
func (r *loraRegistry) list() []*loraAdapter {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.order)
}

// add registers a, or replaces the adapter of that name (loaded in
// place), keeping its position. Adapters are never changed once
// registered, so readers may keep them without the lock.
func (r *loraRegistry) add(a *loraAdapter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.byName[a.name]; old != nil {
		r.order[slices.Index(r.order, old)] = a
	} else {
		r.order = append(r.order, a)
	}
	r.byName[a.name] = a
}

// Errors of the runtime load and unload endpoints, in vLLM's words.
func loraInputError(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "InvalidUserInput", message: fmt.Sprintf(format, a...)}
}

// reserve claims name for a load: it fails when the name is served
// (unless inplace), being loaded, or the instance holds
// MaxLoRAAdapters already.
func (r *loraRegistry) reserve(name string, inplace bool) *apiError {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, exists := r.byName[name]
	switch {
	case r.pending[name] || exists && !inplace:
		return loraInputError("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", name)
	case !exists && len(r.byName)+len(r.pending) >= MaxLoRAAdapters:
		return loraInputError("gpusim holds at most %d LoRA adapters; unload one first.", MaxLoRAAdapters)
	}
	r.pending[name] = true
	return nil
}

// release ends a load's reservation of name.
func (r *loraRegistry) release(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, name)
}

// remove unregisters the adapter called name, reporting whether it was
// served.
func (r *loraRegistry) remove(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.byName[name]
	if a == nil {
		return false
	}
	delete(r.byName, name)
	r.order = slices.DeleteFunc(r.order, func(b *loraAdapter) bool { return b == a })
	return true
}

// modelFor resolves a request's model: the base model ("" or its name),
// or a served adapter (adapter is then its name). Anything else is vLLM's
// 404.
func (in *Instance) modelFor(model string) (adapter string, modelJSON []byte, aerr *apiError) {
	if model == "" || model == in.cfg.Model {
		return "", in.modelJSON, nil
	}
	if a := in.loras.get(model); a != nil {
		return a.name, a.nameJSON, nil
	}
	return "", nil, &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
		message: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// loadLoRARequest is vLLM's LoadLoRAAdapterRequest.
type loadLoRARequest struct {
	Name        *string `json:"lora_name"`
	Path        *string `json:"lora_path"`
	LoadInplace bool    `json:"load_inplace"`
}

// unloadLoRARequest is vLLM's UnloadLoRAAdapterRequest (lora_int_id is
// accepted and ignored, as vLLM now does).
type unloadLoRARequest struct {
	Name  *string `json:"lora_name"`
	IntID *int64  `json:"lora_int_id"`
}

// maxLoRARequestBytes bounds a load or unload body.
const maxLoRARequestBytes = 64 << 10

// readLoRARequest reads a load or unload body into v, with vLLM's checks:
// a JSON content type (415 otherwise), a JSON object of the right types.
func readLoRARequest(w http.ResponseWriter, r *http.Request, v any) *apiError {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &apiError{status: http.StatusUnsupportedMediaType, typ: "Unsupported Media Type",
			message: "Unsupported Media Type: Only 'application/json' is allowed"}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLoRARequestBytes))
	if err != nil {
		return bodyError(err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return validationError("JSON decode error: %v", err)
	}
	return nil
}

// serveLoadLoRA is POST /v1/load_lora_adapter: it reads the adapter (the
// scaled LoRALoadTime), keeps it in host memory and serves it from then
// on. Answers are vLLM's: 200 with a plain-text success line, or its
// error.
func (in *Instance) serveLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loadLoRARequest
	if aerr := readLoRARequest(w, r, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	switch {
	case req.Name == nil:
		writeError(w, validationError("lora_name: Field required"))
		return
	case req.Path == nil:
		writeError(w, validationError("lora_path: Field required"))
		return
	case *req.Name == "" || *req.Path == "":
		writeError(w, loraInputError("Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	name, path := *req.Name, *req.Path
	if why := checkLoRAName(name); why != "" {
		writeError(w, loraInputError("gpusim refuses the LoRA name: it %s.", why))
		return
	}
	if why := checkLoRAPath(path); why != "" {
		writeError(w, loraInputError("gpusim refuses the LoRA path: it %s.", why))
		return
	}
	if name == in.cfg.Model {
		writeError(w, loraInputError("gpusim refuses a LoRA adapter named as its base model."))
		return
	}
	if !in.cfg.EnableLoRA {
		writeError(w, &apiError{status: http.StatusInternalServerError, typ: "InternalServerError",
			message: "LoRA is not enabled. Use --enable-lora to enable LoRA."})
		return
	}
	if aerr := in.loras.reserve(name, req.LoadInplace); aerr != nil {
		writeError(w, aerr)
		return
	}
	defer in.loras.release(name)
	// vLLM answers once the adapter is loaded into host memory.
	if !in.sleep(r.Context(), in.cfg.scaled(in.cfg.LoRALoadTime)) {
		writeError(w, unavailable())
		return
	}
	if !in.eng.do(func() { in.c.loraLoads.Add(1); in.eng.lora.cache(name) }) {
		writeError(w, unavailable())
		return
	}
	in.loras.add(newLoRAAdapter(name, path))
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", name))
}

// serveUnloadLoRA is POST /v1/unload_lora_adapter: the adapter is no
// longer served; requests already admitted with it finish.
func (in *Instance) serveUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req unloadLoRARequest
	if aerr := readLoRARequest(w, r, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	switch {
	case req.Name == nil:
		writeError(w, validationError("lora_name: Field required"))
		return
	case *req.Name == "":
		writeError(w, loraInputError("'lora_name' needs to be provided to unload a LoRA adapter."))
		return
	}
	name := *req.Name
	if !in.loras.remove(name) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "NotFoundError",
			message: fmt.Sprintf("The lora adapter '%s' cannot be found.", name)})
		return
	}
	if !in.eng.do(func() { in.eng.lora.drop(name) }) {
		writeError(w, unavailable())
		return
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", name))
}

func writeText(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, s)
}

// loraSlot is an adapter in a GPU slot, usable from ready on.
type loraSlot struct {
	name  string
	ready time.Time
}

// loraResidency is where adapters are, for the engine (which owns it):
// gpu holds at most MaxLoRAs slots and cpu at most MaxCPULoRAs names,
// both least recently used first. inUse counts the admitted requests of
// each adapter (loading, prefilling or decoding) and waiting those in the
// queue; an adapter in use is never evicted.
type loraResidency struct {
	gpuCap, cpuCap int
	load, swap     time.Duration // scaled
	gpu            []loraSlot
	cpu            []string
	inUse          map[string]int
	waiting        map[string]int
	// changed: inUse's or waiting's set of names changed since the last
	// publish.
	changed bool
	c       *counters
}

func newLoRAResidency(cfg *Config, c *counters) *loraResidency {
	return &loraResidency{
		gpuCap: cfg.MaxLoRAs, cpuCap: cfg.cpuLoRAs(),
		load: cfg.scaled(cfg.LoRALoadTime), swap: cfg.scaled(cfg.LoRASwapTime),
		inUse: map[string]int{}, waiting: map[string]int{}, c: c,
	}
}

// fits reports whether a request for adapter may join the running batch:
// the batch holds it already or fewer than MaxLoRAs distinct adapters.
func (l *loraResidency) fits(adapter string) bool {
	return l.inUse[adapter] > 0 || len(l.inUse) < l.gpuCap
}

// acquire gives an admitted request of adapter a GPU slot and returns
// when its prefill may start: now when the adapter holds a ready slot,
// else after the swap into a slot and, if it is not in host memory, the
// read from disk before it. fits must hold.
func (l *loraResidency) acquire(adapter string, now time.Time) time.Time {
	l.add(l.inUse, adapter)
	if i := slices.IndexFunc(l.gpu, func(s loraSlot) bool { return s.name == adapter }); i >= 0 {
		s := l.gpu[i]
		l.gpu = append(slices.Delete(l.gpu, i, i+1), s)
		l.cache(adapter)
		return s.ready
	}
	cost := l.swap
	if !slices.Contains(l.cpu, adapter) {
		cost += l.load
		l.c.loraLoads.Add(1)
	}
	l.cache(adapter)
	if len(l.gpu) >= l.gpuCap {
		// fits holds, so fewer than gpuCap adapters are in use and one
		// slot is free of them.
		if i := slices.IndexFunc(l.gpu, func(s loraSlot) bool { return l.inUse[s.name] == 0 }); i >= 0 {
			l.gpu = slices.Delete(l.gpu, i, i+1)
		}
	}
	l.c.loraSwaps.Add(1)
	ready := now.Add(cost)
	l.gpu = append(l.gpu, loraSlot{name: adapter, ready: ready})
	return ready
}

// cache puts adapter in host memory, most recently used, evicting the
// least recently used adapter no request uses when memory is full (and
// its GPU slot with it, as vLLM's LRU cache removes it everywhere).
func (l *loraResidency) cache(adapter string) {
	if i := slices.Index(l.cpu, adapter); i >= 0 {
		l.cpu = append(slices.Delete(l.cpu, i, i+1), adapter)
		return
	}
	for len(l.cpu) >= l.cpuCap {
		i := slices.IndexFunc(l.cpu, func(n string) bool { return l.inUse[n] == 0 })
		if i < 0 {
			break // every one in use: host memory holds one more for a while
		}
		l.dropAt(i)
	}
	l.cpu = append(l.cpu, adapter)
}

// drop forgets adapter (unloaded): out of host memory, and out of its GPU
// slot unless requests still use it.
func (l *loraResidency) drop(adapter string) {
	if i := slices.Index(l.cpu, adapter); i >= 0 {
		l.dropAt(i)
	} else if l.inUse[adapter] == 0 {
		l.gpu = slices.DeleteFunc(l.gpu, func(s loraSlot) bool { return s.name == adapter })
	}
}

func (l *loraResidency) dropAt(i int) {
	name := l.cpu[i]
	l.cpu = slices.Delete(l.cpu, i, i+1)
	if l.inUse[name] == 0 {
		l.gpu = slices.DeleteFunc(l.gpu, func(s loraSlot) bool { return s.name == name })
	}
}

func (l *loraResidency) add(m map[string]int, adapter string) {
	if m[adapter] == 0 {
		l.changed = true
	}
	m[adapter]++
}

func (l *loraResidency) done(m map[string]int, adapter string) {
	if m[adapter]--; m[adapter] <= 0 {
		delete(m, adapter)
		l.changed = true
	}
}

// names is m's adapters, sorted and joined with "," as vLLM joins them in
// vllm:lora_requests_info.
func names(m map[string]int) string {
	ns := make([]string, 0, len(m))
	for n := range m {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return strings.Join(ns, ",")
}

// loraInfo is the labels of vllm:lora_requests_info, published by the
// engine.
type loraInfo struct {
	running, waiting string
}

// LoRAAdapters returns the names of the adapters the instance serves, in
// the order they were loaded.
func (in *Instance) LoRAAdapters() []string {
	var out []string
	for _, a := range in.loras.list() {
		out = append(out, a.name)
	}
	return out
}
