package gossip

import (
	"slices"
)

// View is an immutable snapshot of what this node knows about the other
// nodes: their summed in-flight figures, the backends' engine metrics and
// the member list. The Mesh builds a new View on every change and swaps
// it in atomically, so readers take no lock. A View must not be modified.
type View struct {
	version uint64
	self    string
	index   map[string]int // backend -> slot in remote; shared, read-only
	remote  []int64
	engine  map[string]EngineStats
	members []string // sorted, self included

	// failing: backend -> the other nodes whose fresh figure says it is
	// failing, sorted; voters: the other nodes heard from within
	// ExpireAfter, sorted (see Health).
	failing       map[string][]string
	voters        []string
	healthVersion uint64 // version of the View that last changed health
}

// BackendHealth is how the other live nodes see one backend: the names of
// those whose latest figure says it is failing and of those that see it
// healthy, each sorted. A node sends figures only for the backends it has
// requests open to or sees failing (an idle backend costs nothing on the
// wire), so every other node heard from within ExpireAfter that does not
// say the backend is failing sees it healthy; a node not heard from that
// long is in neither. The slices must not be modified.
type BackendHealth struct {
	Healthy []string
	Failing []string
}

// RemoteInFlight is the sum of the latest unexpired in-flight figures for
// backend from every other live node. Global in-flight is the local count
// plus this.
func (v *View) RemoteInFlight(backend string) int64 {
	if i, ok := v.index[backend]; ok {
		return v.remote[i]
	}
	return 0
}

// Health returns how the other live nodes see backend. It allocates the
// Healthy list: for the Raft leader's verdicts and the admin API, not for
// a request's path.
func (v *View) Health(backend string) BackendHealth {
	f := v.failing[backend]
	h := BackendHealth{Failing: f}
	for _, name := range v.voters {
		if !slices.Contains(f, name) {
			h.Healthy = append(h.Healthy, name)
		}
	}
	return h
}

// HealthVersion changes whenever any node's view of any backend's health
// changes, or a node starts or stops reporting on a backend.
func (v *View) HealthVersion() uint64 { return v.healthVersion }

// Engine returns the freshest unexpired engine metrics for backend,
// whichever node scraped them (this one included).
func (v *View) Engine(backend string) (EngineStats, bool) {
	s, ok := v.engine[backend]
	return s, ok
}

// Members returns the names of the live members, sorted, this node
// included.
func (v *View) Members() []string { return slices.Clone(v.members) }

// Scraper returns the member that owns scraping backend's engine metrics:
// the highest rendezvous hash of (member, backend) over the live members.
// Every node with the same member list gets the same answer, and a
// membership change moves only the backends of the members that came or
// went.
func (v *View) Scraper(backend string) string { return rendezvous(v.members, backend) }

// rendezvous returns the member with the highest hash of (member, key);
// ties, which need a 64-bit collision, go to the greater name.
func rendezvous(members []string, key string) string {
	var best string
	var bestH uint64
	kh := fnv1a(fnvOffset, key)
	for _, m := range members {
		h := mix64(fnv1a(kh^0x9e3779b97f4a7c15, m))
		if best == "" || h > bestH || (h == bestH && m > best) {
			best, bestH = m, h
		}
	}
	return best
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnv1a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// mix64 is the splitmix64 finalizer; it spreads FNV's weak low bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
