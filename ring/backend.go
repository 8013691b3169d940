package ring

import (
	"fmt"
	"strings"
)

// State is a backend's administrative state.
type State uint8

const (
	// Active backends take new requests.
	Active State = iota
	// Draining backends keep their open streams but take no new requests.
	// They keep their ring position, so their partitions overflow along the
	// same order every node uses, and nothing else moves.
	Draining
	// Down backends take nothing until they are marked active again. Like
	// draining ones they keep their ring position, so a flapping backend
	// does not reshuffle the fleet's caches.
	Down
)

func (s State) String() string {
	switch s {
	case Active:
		return "active"
	case Draining:
		return "draining"
	case Down:
		return "down"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState parses "active", "draining" or "down".
func ParseState(s string) (State, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "active", "":
		return Active, nil
	case "draining", "drain":
		return Draining, nil
	case "down":
		return Down, nil
	}
	return Active, fmt.Errorf("%w: unknown backend state %q (want active, draining or down)", ErrConfig, s)
}

// Backend is one GPU instance as the ring sees it.
type Backend struct {
	// ID names the backend uniquely and stably; placement depends only on
	// the set of IDs. Usually host:port.
	ID string
	// Addr is where the proxy connects (host:port). Not used for placement.
	Addr string
	// Zone is the availability zone, for zone-aware overflow.
	Zone string
	// Weight scales the backend's concurrency limit (1 = the configured
	// ConcurrencyThreshold; 2 = twice that). 0 means 1.
	Weight int
	// State is the administrative state.
	State State
}

func (b Backend) weight() int64 {
	if b.Weight <= 0 {
		return 1
	}
	return int64(b.Weight)
}
