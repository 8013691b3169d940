package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/ring"
)

// Backend states, as stored in State and accepted by commands.
const (
	StateActive   = "active"
	StateDraining = "draining"
	StateDown     = "down"
)

// Backend sources: who added a backend. Discovery removes only what it
// added.
const (
	SourceConfig = "config" // the seed (the config file)
	SourceAdmin  = "admin"  // the admin API
	SourceDNS    = "dns"    // DNS or Kubernetes discovery
)

// Who set a backend's state last. Health commits never override a state
// an operator set: they only move active to down, and down back to active
// when health put it there.
const (
	ByAdmin  = "admin"
	ByHealth = "health"
)

// Limits the state machine enforces on every node.
const (
	maxZoneLen   = 64
	maxWeight    = 1000
	maxLabels    = 32
	maxLabelSize = 256
)

// Backend is one GPU instance in the agreed state.
type Backend struct {
	// ID names the backend uniquely and stably (placement depends on it).
	ID string `json:"id"`
	// URL is the base URL the proxy connects to, http:// or https://.
	URL string `json:"url"`
	// Zone is the failure domain, for zone-aware overflow.
	Zone string `json:"zone,omitempty"`
	// Weight scales the backend's concurrency limit; 0 means 1.
	Weight int `json:"weight,omitempty"`
	// State is active, draining (open streams finish, no new requests) or
	// down.
	State string `json:"state"`
	// StateBy is who set State last: admin or health.
	StateBy string `json:"state_by,omitempty"`
	// Labels are free-form operator labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Source is who added the backend: config, admin or dns.
	Source string `json:"source"`
	// Models are the model ids the backend serves, adapters included,
	// sorted (set_models; from its /v1/models, polled by the leader, or
	// declared in the config). Empty: not known, so it takes any model.
	Models []string `json:"models,omitempty"`
}

// RingBackend is the ring's view of b. Addr is b.URL; the node converts it
// to the proxy's address form.
func (b Backend) RingBackend() ring.Backend {
	st, _ := ring.ParseState(b.State) // validated on apply
	return ring.Backend{ID: b.ID, Addr: b.URL, Zone: b.Zone, Weight: b.Weight, State: st}
}

// State is the replicated state: what every node builds its ring from.
type State struct {
	// Backends, sorted by ID.
	Backends []Backend     `json:"backends"`
	Routing  ring.Settings `json:"routing"`
	// Seeded is false until the first seed command; until then the node
	// routes on its own config file.
	Seeded bool `json:"seeded"`
	// ClusterID names the cluster: random, set by the seed (or, for a
	// state seeded before IDs existed, by the first leader that finds it
	// empty) and never changed. Every node keeps it in its data
	// directory and refuses to exchange Raft messages with a node whose
	// data belong to another cluster.
	ClusterID string `json:"cluster_id,omitempty"`
	// Splits are the prefixes that carry too much traffic for one
	// backend (see ring.Splits), in canonical order; the leader commits
	// them from the traffic it routes.
	Splits []ring.Split `json:"splits,omitempty"`
	// Moves are the partitions the leader's balancer handed to another
	// backend (see ring.Move), by partition.
	Moves []ring.Move `json:"moves,omitempty"`
	// RevokedNames and RevokedSerials are the cluster's revocation list,
	// sorted, in canonical form (identity.CheckName,
	// identity.CanonicalSerial): a router certificate that names one of
	// the routers, or carries one of the serial numbers, proves nothing
	// to any router (internal/identity.Revocations).
	RevokedNames   []string `json:"revoked_names,omitempty"`
	RevokedSerials []string `json:"revoked_serials,omitempty"`
	// RecomputeUnit is the agreed work unit of the COST overflow rule, in
	// bytes: what an average request makes its backend prefill (see
	// proxy.RecomputeFigures); the leader commits the routers' mean
	// (set_recompute_unit). 0: none, each router uses its own.
	RecomputeUnit int64 `json:"recompute_unit,omitempty"`
}

// Revoked reports whether router name is revoked by name.
func (s *State) Revoked(name string) bool {
	_, ok := slices.BinarySearch(s.RevokedNames, name)
	return ok
}

// Backend returns the backend with the given ID.
func (s *State) Backend(id string) (Backend, bool) {
	i, ok := s.find(id)
	if !ok {
		return Backend{}, false
	}
	return s.Backends[i], true
}

func (s *State) find(id string) (int, bool) {
	return slices.BinarySearchFunc(s.Backends, id, func(b Backend, id string) int { return strings.Compare(b.ID, id) })
}

// RingBackends is the ring's view of every backend.
func (s *State) RingBackends() []ring.Backend {
	out := make([]ring.Backend, len(s.Backends))
	for i, b := range s.Backends {
		out[i] = b.RingBackend()
	}
	return out
}

// Clone returns a deep copy.
func (s State) Clone() State {
	out := s
	out.Splits = slices.Clone(s.Splits)
	out.Moves = slices.Clone(s.Moves)
	out.RevokedNames = slices.Clone(s.RevokedNames)
	out.RevokedSerials = slices.Clone(s.RevokedSerials)
	out.Backends = make([]Backend, len(s.Backends))
	for i, b := range s.Backends {
		b.Labels = maps.Clone(b.Labels)
		b.Models = slices.Clone(b.Models)
		out.Backends[i] = b
	}
	return out
}

func (s *State) equal(o *State) bool { return reflect.DeepEqual(s, o) }

// Op names a command.
type Op string

// Commands.
const (
	// OpSeed sets the backends and routing config once: it does nothing
	// when the state was seeded before.
	OpSeed Op = "seed"
	// OpUpsertBackend adds a backend or replaces one with the same ID. An
	// empty State keeps the current state (active for a new backend).
	OpUpsertBackend Op = "upsert_backend"
	// OpRemoveBackend removes a backend.
	OpRemoveBackend Op = "remove_backend"
	// OpSetBackendState sets a backend's state.
	OpSetBackendState Op = "set_backend_state"
	// OpSetRouting replaces the routing config.
	OpSetRouting Op = "set_routing"
	// OpSyncDiscovered makes the DNS-discovered backends exactly the given
	// ones, leaving backends from other sources alone.
	OpSyncDiscovered Op = "sync_discovered"
	// OpSetClusterID sets the cluster ID of a state seeded without one.
	// It never changes an ID that is set.
	OpSetClusterID Op = "set_cluster_id"
	// OpSetSplits replaces the split prefixes.
	OpSetSplits Op = "set_splits"
	// OpSetMoves replaces the moved partitions.
	OpSetMoves Op = "set_moves"
	// OpSetModels sets the models backend ID serves (Models; empty: not
	// known).
	OpSetModels Op = "set_models"
	// OpRevoke adds router names (Names) and certificate serial numbers
	// (Serials) to the revocation list.
	OpRevoke Op = "revoke"
	// OpUnrevoke takes them off it.
	OpUnrevoke Op = "unrevoke"
	// OpSetRecomputeUnit sets the agreed recompute work unit (Unit, in
	// bytes; 0 clears it).
	OpSetRecomputeUnit Op = "set_recompute_unit"
)

// MaxRecomputeUnit bounds RecomputeUnit (proxy.MaxRecomputeUnit).
const MaxRecomputeUnit = 1 << 31

// CommandLevel is the newest set of commands this build applies; routers
// advertise theirs in gossip (gossip.Meta.Ops) and the leader writes a
// command only when every router can apply it (Agreement.Apply,
// ErrVersionSkew). A router that meets a command it cannot decode halts
// its state machine, so without this a rolling upgrade that turned a new
// feature on before the last old router was replaced would stop that
// router. Levels:
//
//	1: everything up to set_cluster_id (versions that advertise nothing)
//	2: set_splits, set_moves, set_models, backends with models, and
//	   routing settings with key_depth, overflow or session_header set
//	   (ADAPTIVE keys, COST overflow, model-aware routing, session
//	   affinity)
//	3: revoke and unrevoke (the revocation list: a router of level 2
//	   would neither decode them nor check revocations)
//	4: set_recompute_unit (the agreed work unit of the COST rule)
//
// Routing settings that name a strategy need at least the strategy's
// level in ring's strategy table (ring.StrategyInfo.Level): a new
// strategy takes the level of the build that adds it there.
const CommandLevel uint8 = 4

// level is the CommandLevel a router needs to apply cmd.
func (cmd *Command) level() uint8 {
	return max(cmd.opLevel(), routingLevel(cmd.Routing))
}

// opLevel is the level of cmd's op and backends.
func (cmd *Command) opLevel() uint8 {
	switch {
	case cmd.Op == OpSetRecomputeUnit:
		return 4
	case cmd.Op == OpRevoke, cmd.Op == OpUnrevoke:
		return 3
	case cmd.Op == OpSetSplits, cmd.Op == OpSetMoves, cmd.Op == OpSetModels:
		return 2
	case slices.ContainsFunc(cmd.Backends, func(b Backend) bool { return len(b.Models) > 0 }),
		cmd.Backend != nil && len(cmd.Backend.Models) > 0:
		return 2
	}
	return 1
}

// routingLevel is the level a router needs to decode routing settings r
// (nil: none): the highest of its strategy's, key depth's and overflow
// rule's, from ring's tables, and 2 for a session_header set. A value
// outside the tables counts as 1: such settings are refused when applied.
func routingLevel(r *ring.Settings) uint8 {
	if r == nil {
		return 1
	}
	l := uint8(1)
	if info, ok := r.Strategy.Info(); ok {
		l = max(l, info.Level)
	}
	l = max(l, r.KeyDepth.Level(), r.Overflow.Level())
	if r.SessionHeader != "" {
		l = max(l, 2)
	}
	return l
}

// Command is one change to the state: a Raft log entry, JSON encoded. Build
// one with the functions below.
type Command struct {
	Op       Op             `json:"op"`
	Backend  *Backend       `json:"backend,omitempty"`
	Backends []Backend      `json:"backends,omitempty"`
	ID       string         `json:"id,omitempty"`
	State    string         `json:"state,omitempty"`
	By       string         `json:"by,omitempty"`
	Routing  *ring.Settings `json:"routing,omitempty"`
	// ClusterID is the cluster's ID (OpSeed, OpSetClusterID).
	ClusterID string `json:"cluster_id,omitempty"`
	// Splits are OpSetSplits' prefixes.
	Splits []ring.Split `json:"splits,omitempty"`
	// Moves are OpSetMoves' partitions.
	Moves []ring.Move `json:"moves,omitempty"`
	// Models are OpSetModels' model ids.
	Models []string `json:"models,omitempty"`
	// Names and Serials are OpRevoke's and OpUnrevoke's router names
	// and certificate serial numbers.
	Names   []string `json:"names,omitempty"`
	Serials []string `json:"serials,omitempty"`
	// Unit is OpSetRecomputeUnit's work unit in bytes.
	Unit int64 `json:"unit,omitempty"`
}

// SetRecomputeUnit returns the command that makes unit (bytes; 0: none)
// the agreed recompute work unit.
func SetRecomputeUnit(unit int64) Command { return Command{Op: OpSetRecomputeUnit, Unit: unit} }

// Revoke returns the command that adds router names and certificate
// serial numbers to the revocation list.
func Revoke(names, serials []string) Command {
	return Command{Op: OpRevoke, Names: names, Serials: serials}
}

// Unrevoke returns the command that takes router names and certificate
// serial numbers off the revocation list.
func Unrevoke(names, serials []string) Command {
	return Command{Op: OpUnrevoke, Names: names, Serials: serials}
}

// SetModels returns the command that records the models backend id
// serves (none: not known).
func SetModels(id string, models []string) Command {
	return Command{Op: OpSetModels, ID: id, Models: models}
}

// SetMoves returns the command that makes moves the moved partitions.
func SetMoves(moves []ring.Move) Command { return Command{Op: OpSetMoves, Moves: moves} }

// SetSplits returns the command that makes splits the split prefixes.
func SetSplits(splits []ring.Split) Command { return Command{Op: OpSetSplits, Splits: splits} }

// Seed returns a seed command (see OpSeed). The leader that commits it
// gives it a new cluster ID.
func Seed(backends []Backend, r ring.Settings) Command {
	return Command{Op: OpSeed, Backends: backends, Routing: &r}
}

// SetClusterID returns the command that names a cluster seeded without an
// ID.
func SetClusterID(id string) Command { return Command{Op: OpSetClusterID, ClusterID: id} }

// UpsertBackend returns an upsert command (see OpUpsertBackend).
func UpsertBackend(b Backend) Command { return Command{Op: OpUpsertBackend, Backend: &b} }

// RemoveBackend returns a remove command.
func RemoveBackend(id string) Command { return Command{Op: OpRemoveBackend, ID: id} }

// SetBackendState returns an operator's state change (active, draining,
// down).
func SetBackendState(id, state string) Command {
	return Command{Op: OpSetBackendState, ID: id, State: state, By: ByAdmin}
}

// SetRouting returns a routing config change.
func SetRouting(r ring.Settings) Command { return Command{Op: OpSetRouting, Routing: &r} }

// A log entry is a command's JSON with a checksum in front:
//
//	{"sum":"<xxhash64 of the rest, 16 hex digits>",<the command's JSON after its '{'>
//
// which is still one JSON object. A byte changed inside an entry on one
// node's disk fails the checksum there, and that node stops applying
// instead of routing on a state the others do not have. Entries written
// before checksums existed start with {"op": and are accepted as they are.
const (
	sumPrefix = `{"sum":"`
	sumLen    = 16
	sumEnd    = len(sumPrefix) + sumLen // index of the '"' closing the sum
)

func encodeCommand(c Command) ([]byte, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, sumEnd+2+len(body))
	out = append(out, sumPrefix...)
	out = fmt.Appendf(out, "%016x", xxhash.Sum64(body))
	out = append(out, '"', ',')
	return append(out, body[1:]...), nil
}

// decodeCommand checks an entry's checksum and decodes it. Every failure
// wraps ErrCorrupt.
func decodeCommand(b []byte) (Command, error) {
	var c Command
	var body []byte
	switch {
	case bytes.HasPrefix(b, []byte(sumPrefix)):
		if len(b) < sumEnd+3 || b[sumEnd] != '"' || b[sumEnd+1] != ',' {
			return c, fmt.Errorf("%w: malformed checksum", ErrCorrupt)
		}
		hexSum := b[len(sumPrefix):sumEnd]
		if !isLowerHex(string(hexSum)) { // as written
			return c, fmt.Errorf("%w: malformed checksum", ErrCorrupt)
		}
		want, err := strconv.ParseUint(string(hexSum), 16, 64)
		if err != nil {
			return c, fmt.Errorf("%w: malformed checksum", ErrCorrupt)
		}
		body = append([]byte{'{'}, b[sumEnd+2:]...)
		if got := xxhash.Sum64(body); got != want {
			return c, fmt.Errorf("%w: checksum %016x, the entry hashes to %016x", ErrCorrupt, want, got)
		}
	case bytes.HasPrefix(b, []byte(`{"op":"`)):
		body = b // written before checksums
	default:
		return c, fmt.Errorf("%w: not a command", ErrCorrupt)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if dec.More() {
		return c, fmt.Errorf("%w: trailing data", ErrCorrupt)
	}
	if !knownOp(c.Op) {
		return c, fmt.Errorf("%w: unknown op %q (a router of a newer version wrote it: upgrade this one)", ErrCorrupt, c.Op)
	}
	c.normalize()
	return c, nil
}

// normalize gives an entry one in-memory form however it was spelled: an
// empty list or label map is nil, as encodeCommand omits both. Without it
// `"backends":[]` and no backends at all would be different commands that
// encode to the same entry.
func (c *Command) normalize() {
	if len(c.Backends) == 0 {
		c.Backends = nil
	}
	for i := range c.Backends {
		if len(c.Backends[i].Labels) == 0 {
			c.Backends[i].Labels = nil
		}
	}
	if c.Backend != nil && len(c.Backend.Labels) == 0 {
		c.Backend.Labels = nil
	}
	if len(c.Splits) == 0 {
		c.Splits = nil
	}
	if len(c.Moves) == 0 {
		c.Moves = nil
	}
	if len(c.Names) == 0 {
		c.Names = nil
	}
	if len(c.Serials) == 0 {
		c.Serials = nil
	}
}

func knownOp(op Op) bool {
	switch op {
	case OpSeed, OpUpsertBackend, OpRemoveBackend, OpSetBackendState, OpSetRouting, OpSyncDiscovered, OpSetClusterID, OpSetSplits, OpSetMoves, OpSetModels,
		OpRevoke, OpUnrevoke, OpSetRecomputeUnit:
		return true
	}
	return false
}

// apply returns the state after cmd. It is pure and deterministic: every
// node computes the same result from the same state and command. changed
// is false when cmd leaves the state as it was; on error the state is
// unchanged.
func apply(cur *State, cmd Command) (next State, changed bool, err error) {
	if cmd.Op != OpSeed && !cur.Seeded {
		return *cur, false, fmt.Errorf("%w: %s before the state was seeded", ErrInvalid, cmd.Op)
	}
	next = cur.Clone()
	switch cmd.Op {
	case OpSeed:
		if cur.Seeded {
			return *cur, false, nil
		}
		if cmd.Routing == nil {
			return *cur, false, fmt.Errorf("%w: seed without routing", ErrInvalid)
		}
		next.Routing = *cmd.Routing
		next.ClusterID = cmd.ClusterID
		next.Backends = next.Backends[:0]
		for _, b := range cmd.Backends {
			b, err := normBackend(b, Backend{}, false, SourceConfig)
			if err != nil {
				return *cur, false, err
			}
			next.Backends = append(next.Backends, b)
		}
		// State keeps backends sorted by ID (validate relies on it to find
		// duplicates); a config file lists them in any order.
		slices.SortFunc(next.Backends, func(a, b Backend) int { return strings.Compare(a.ID, b.ID) })
		next.Seeded = true
	case OpUpsertBackend:
		if cmd.Backend == nil {
			return *cur, false, fmt.Errorf("%w: upsert without a backend", ErrInvalid)
		}
		old, exists := cur.Backend(cmd.Backend.ID)
		b, err := normBackend(*cmd.Backend, old, exists, SourceAdmin)
		if err != nil {
			return *cur, false, err
		}
		next.put(b)
	case OpRemoveBackend:
		i, ok := next.find(cmd.ID)
		if !ok {
			return *cur, false, fmt.Errorf("%w: %q", ErrUnknownBackend, cmd.ID)
		}
		next.Backends = slices.Delete(next.Backends, i, i+1)
	case OpSetBackendState:
		i, ok := next.find(cmd.ID)
		if !ok {
			return *cur, false, fmt.Errorf("%w: %q", ErrUnknownBackend, cmd.ID)
		}
		st, err := normState(cmd.State)
		if err != nil {
			return *cur, false, err
		}
		b := &next.Backends[i]
		switch cmd.By {
		case ByHealth:
			// Health moves active->down and back only its own downs; an
			// operator's draining or down stands.
			switch {
			case st == StateDown && b.State == StateActive,
				st == StateActive && b.State == StateDown && b.StateBy == ByHealth:
				b.State, b.StateBy = st, ByHealth
			case st == StateDraining:
				return *cur, false, fmt.Errorf("%w: health cannot drain a backend", ErrInvalid)
			}
		case ByAdmin, "":
			b.State, b.StateBy = st, ByAdmin
		default:
			return *cur, false, fmt.Errorf("%w: unknown state setter %q", ErrInvalid, cmd.By)
		}
	case OpSetRouting:
		if cmd.Routing == nil {
			return *cur, false, fmt.Errorf("%w: set_routing without routing", ErrInvalid)
		}
		next.Routing = *cmd.Routing
	case OpSetClusterID:
		switch {
		case cur.ClusterID == cmd.ClusterID:
			return *cur, false, nil
		case cur.ClusterID != "":
			return *cur, false, fmt.Errorf("%w: the cluster ID is %s already", ErrInvalid, cur.ClusterID)
		case cmd.ClusterID == "":
			return *cur, false, fmt.Errorf("%w: empty cluster ID", ErrInvalid)
		}
		next.ClusterID = cmd.ClusterID
	case OpSetSplits:
		set, err := ring.NewSplits(cmd.Splits)
		if err != nil {
			return *cur, false, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		next.Splits = nil
		if set.Len() > 0 {
			next.Splits = slices.Clone(set.List())
		}
	case OpSetModels:
		i, ok := slices.BinarySearchFunc(next.Backends, cmd.ID, func(b Backend, id string) int { return strings.Compare(b.ID, id) })
		if !ok {
			return *cur, false, fmt.Errorf("%w: %q", ErrUnknownBackend, cmd.ID)
		}
		models, err := normModels(cmd.Models)
		if err != nil {
			return *cur, false, fmt.Errorf("%w: backend %s: %v", ErrInvalid, cmd.ID, err)
		}
		b := next.Backends[i]
		b.Models = models
		next.Backends = slices.Clone(next.Backends)
		next.Backends[i] = b
	case OpSetRecomputeUnit:
		if cmd.Unit < 0 || cmd.Unit > MaxRecomputeUnit {
			return *cur, false, fmt.Errorf("%w: recompute unit %d out of 0..%d", ErrInvalid, cmd.Unit, MaxRecomputeUnit)
		}
		if cmd.Unit == cur.RecomputeUnit {
			return *cur, false, nil
		}
		next.RecomputeUnit = cmd.Unit
	case OpSetMoves:
		if err := ring.CheckMoves(cmd.Moves); err != nil {
			return *cur, false, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		next.Moves = nil
		if len(cmd.Moves) > 0 {
			next.Moves = slices.Clone(cmd.Moves)
			ring.SortMoves(next.Moves)
		}
	case OpRevoke, OpUnrevoke:
		names, serials, err := normRevocations(cmd.Names, cmd.Serials)
		if err != nil {
			return *cur, false, err
		}
		edit := mergeSorted
		if cmd.Op == OpUnrevoke {
			edit = subtractSorted
		}
		next.RevokedNames = edit(next.RevokedNames, names)
		next.RevokedSerials = edit(next.RevokedSerials, serials)
	case OpSyncDiscovered:
		want := make(map[string]bool, len(cmd.Backends))
		for _, d := range cmd.Backends {
			old, exists := cur.Backend(d.ID)
			if exists && old.Source != SourceDNS {
				continue // an operator's backend with the same ID wins
			}
			d.Source = SourceDNS
			d.State, d.StateBy = "", ""
			b, err := normBackend(d, old, exists, SourceDNS)
			if err != nil {
				return *cur, false, err
			}
			if want[b.ID] {
				return *cur, false, fmt.Errorf("%w: backend %q listed twice", ErrInvalid, b.ID)
			}
			want[b.ID] = true
			next.put(b)
		}
		next.Backends = slices.DeleteFunc(next.Backends, func(b Backend) bool { return b.Source == SourceDNS && !want[b.ID] })
	default:
		return *cur, false, fmt.Errorf("%w: unknown op %q", ErrInvalid, cmd.Op)
	}
	if err := next.validate(); err != nil {
		return *cur, false, err
	}
	return next, !next.equal(cur), nil
}

// put inserts or replaces b, keeping Backends sorted.
func (s *State) put(b Backend) {
	i, ok := s.find(b.ID)
	if ok {
		s.Backends[i] = b
		return
	}
	s.Backends = slices.Insert(s.Backends, i, b)
}

// normBackend fills defaults: an empty state keeps old's (active when new),
// an empty source keeps old's (src when new), empty labels are nil.
func normBackend(b, old Backend, exists bool, src string) (Backend, error) {
	b.ID = strings.TrimSpace(b.ID)
	if b.State == "" {
		if exists {
			b.State, b.StateBy = old.State, old.StateBy
		} else {
			b.State = StateActive
		}
	} else {
		st, err := normState(b.State)
		if err != nil {
			return b, err
		}
		// Restating the current state keeps its setter; a new state is the
		// operator's.
		b.StateBy = ByAdmin
		if exists && st == old.State {
			b.StateBy = old.StateBy
		}
		b.State = st
	}
	if b.Source == "" {
		b.Source = src
		if exists {
			b.Source = old.Source
		}
	}
	if len(b.Labels) == 0 {
		b.Labels = nil
	}
	if len(b.Models) == 0 && exists {
		b.Models = old.Models // what the backend serves does not change with its settings
	}
	models, err := normModels(b.Models)
	if err != nil {
		return b, fmt.Errorf("%w: backend %s: %v", ErrInvalid, b.ID, err)
	}
	b.Models = models
	return b, nil
}

// Bounds of a backend's models.
const (
	maxModels   = 1024
	maxModelLen = 256
)

// normModels checks a model list (at most maxModels ids of 1-maxModelLen
// printable characters) and returns it sorted without repeats, nil when
// empty.
func normModels(ms []string) ([]string, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	if len(ms) > maxModels {
		return nil, fmt.Errorf("%d models, at most %d", len(ms), maxModels)
	}
	for _, m := range ms {
		if m == "" || len(m) > maxModelLen || !printable(m) {
			return nil, fmt.Errorf("model %q: 1-%d printable characters", m, maxModelLen)
		}
	}
	out := slices.Clone(ms)
	slices.Sort(out)
	return slices.Compact(out), nil
}

func normState(s string) (string, error) {
	st, err := ring.ParseState(s)
	if err != nil || s == "" {
		return "", fmt.Errorf("%w: backend state %q (want active, draining or down)", ErrInvalid, s)
	}
	return st.String(), nil
}

// validate checks what every ring build needs: unique, well-formed
// backends and a routing config within the ring's ranges.
func (s *State) validate() error {
	if len(s.Backends) > ring.MaxBackends {
		return fmt.Errorf("%w: %d backends, at most %d", ErrInvalid, len(s.Backends), ring.MaxBackends)
	}
	for i, b := range s.Backends {
		if i > 0 && s.Backends[i-1].ID >= b.ID {
			return fmt.Errorf("%w: backend %q listed twice", ErrInvalid, b.ID)
		}
		if err := b.validate(); err != nil {
			return err
		}
	}
	if err := checkClusterID(s.ClusterID); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := ring.NewSplits(s.Splits); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := ring.CheckMoves(s.Moves); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if s.RecomputeUnit < 0 || s.RecomputeUnit > MaxRecomputeUnit {
		return fmt.Errorf("%w: recompute unit %d out of 0..%d", ErrInvalid, s.RecomputeUnit, MaxRecomputeUnit)
	}
	for _, m := range s.Moves {
		if err := CheckBackendID(m.Backend); err != nil {
			return fmt.Errorf("%w: partition %d moved: %v", ErrInvalid, m.Partition, err)
		}
	}
	if s.Seeded {
		if err := s.Routing.Validate(); err != nil {
			return fmt.Errorf("%w: routing: %v", ErrInvalid, err)
		}
	}
	return checkRevocations(s.RevokedNames, s.RevokedSerials)
}

// maxRevoked bounds each half of the revocation list (every TLS handshake
// and signature check consults it; a map lookup each).
const maxRevoked = 10000

// normRevocations checks a revoke or unrevoke command's lists and returns
// them in canonical form, sorted, without repeats. At least one entry is
// needed.
func normRevocations(names, serials []string) ([]string, []string, error) {
	if len(names) == 0 && len(serials) == 0 {
		return nil, nil, fmt.Errorf("%w: no router name or serial number to revoke", ErrInvalid)
	}
	if len(names) > maxRevoked || len(serials) > maxRevoked {
		return nil, nil, fmt.Errorf("%w: at most %d names and %d serial numbers", ErrInvalid, maxRevoked, maxRevoked)
	}
	var outNames, outSerials []string
	for _, n := range names {
		if err := identity.CheckName(n); err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		outNames = append(outNames, n)
	}
	for _, v := range serials {
		c, err := identity.CanonicalSerial(v)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		outSerials = append(outSerials, c)
	}
	slices.Sort(outNames)
	slices.Sort(outSerials)
	return slices.Compact(outNames), slices.Compact(outSerials), nil
}

// checkRevocations checks a state's revocation list: bounded, canonical,
// sorted and without repeats.
func checkRevocations(names, serials []string) error {
	if len(names) > maxRevoked || len(serials) > maxRevoked {
		return fmt.Errorf("%w: the revocation list holds more than %d names or serial numbers", ErrInvalid, maxRevoked)
	}
	for i, n := range names {
		if err := identity.CheckName(n); err != nil || (i > 0 && names[i-1] >= n) {
			return fmt.Errorf("%w: revoked names must be sorted, distinct router names (%q)", ErrInvalid, n)
		}
	}
	for i, v := range serials {
		if c, err := identity.CanonicalSerial(v); err != nil || c != v || (i > 0 && serials[i-1] >= v) {
			return fmt.Errorf("%w: revoked serial numbers must be sorted, distinct and in canonical hex (%q)", ErrInvalid, v)
		}
	}
	return nil
}

// mergeSorted returns the sorted union of two sorted lists without
// repeats; nil when empty.
func mergeSorted(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

// subtractSorted returns a without the elements of b; nil when empty.
func subtractSorted(a, b []string) []string {
	out := slices.DeleteFunc(slices.Clone(a), func(v string) bool {
		_, found := slices.BinarySearch(b, v)
		return found
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// CheckBackendID reports whether id can name a backend
// (backendspec.CheckID: 1-253 printable ASCII characters, no spaces or
// commas), as ErrInvalid.
func CheckBackendID(id string) error {
	if err := backendspec.CheckID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func (b *Backend) validate() error {
	if err := CheckBackendID(b.ID); err != nil {
		return err
	}
	switch {
	case len(b.Zone) > maxZoneLen || !printable(b.Zone):
		return fmt.Errorf("%w: backend %s: zone %q: at most %d printable characters", ErrInvalid, b.ID, b.Zone, maxZoneLen)
	case b.Weight < 0 || b.Weight > maxWeight:
		return fmt.Errorf("%w: backend %s: weight %d out of range [0, %d]", ErrInvalid, b.ID, b.Weight, maxWeight)
	case b.State != StateActive && b.State != StateDraining && b.State != StateDown:
		return fmt.Errorf("%w: backend %s: state %q", ErrInvalid, b.ID, b.State)
	case b.StateBy != "" && b.StateBy != ByAdmin && b.StateBy != ByHealth:
		return fmt.Errorf("%w: backend %s: state set by %q", ErrInvalid, b.ID, b.StateBy)
	case b.Source != SourceConfig && b.Source != SourceAdmin && b.Source != SourceDNS:
		return fmt.Errorf("%w: backend %s: source %q (want config, admin or dns)", ErrInvalid, b.ID, b.Source)
	case len(b.Labels) > maxLabels:
		return fmt.Errorf("%w: backend %s: more than %d labels", ErrInvalid, b.ID, maxLabels)
	}
	for k, v := range b.Labels {
		if k == "" || len(k) > maxLabelSize || len(v) > maxLabelSize || !printable(k) || !printable(v) {
			return fmt.Errorf("%w: backend %s: label %q: key 1-%d printable characters, value at most %d", ErrInvalid, b.ID, k, maxLabelSize, maxLabelSize)
		}
	}
	if ms, err := normModels(b.Models); err != nil || len(ms) != len(b.Models) {
		return fmt.Errorf("%w: backend %s: models must be at most %d sorted, distinct ids of 1-%d printable characters", ErrInvalid, b.ID, maxModels, maxModelLen)
	}
	u, err := url.Parse(b.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return fmt.Errorf("%w: backend %s: url %q must be http:// or https:// with a host", ErrInvalid, b.ID, b.URL)
	}
	return nil
}
