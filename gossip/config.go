package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/hostname"
)

// defaultPort is the gossip port (TCP and UDP) used when none is given.
const defaultPort = 7946

// Errors returned by Validate and New.
var (
	ErrNoNodeName     = errors.New("gossip: node name is empty")
	ErrPlaintext      = errors.New("gossip: refusing to gossip in plaintext on a non-loopback address; set a secret key or allow plaintext explicitly")
	ErrKeyLength      = errors.New("gossip: secret key must be 16, 24 or 32 bytes (AES-128/192/256)")
	ErrMetaTooLarge   = errors.New("gossip: node metadata exceeds 512 bytes")
	ErrInvalidConfig  = errors.New("gossip: invalid config")
	ErrBadMessage     = errors.New("gossip: malformed message")
	ErrUnknownVersion = errors.New("gossip: unknown message version")
)

// Config configures a Mesh. Start from DefaultConfig; a Config must not
// be changed after it is passed to New.
type Config struct {
	// NodeName identifies this node in the cluster (flag --node-name). It
	// must be unique and should be stable across restarts. Default: the
	// host name.
	NodeName string

	// BindAddr and BindPort are where the gossip TCP and UDP listeners bind
	// (flag --gossip-listen host:port). Default 0.0.0.0:7946. Port 0 picks a
	// free port (tests); Mesh.Addr reports it.
	BindAddr string
	BindPort int

	// AdvertiseAddr and AdvertisePort are what other nodes use to reach this
	// one when it differs from the bind address (NAT, containers). Empty and
	// 0 mean: derived from the bind address (a private IP when binding to
	// 0.0.0.0) and the bound port.
	AdvertiseAddr string
	AdvertisePort int

	// Join lists seed nodes (flag --join, repeatable or comma separated):
	// "host:port", "host" (port BindPort, or 7946 when BindPort is 0), or a
	// DNS name whose every A/AAAA record is a seed. New joins them once; if
	// none answers the Mesh keeps retrying in the background, and later
	// it rejoins seeds when it finds itself alone and reconnects to failed
	// members, so a healed partition merges again.
	Join []string

	// Meta is advertised to other nodes in memberlist's node metadata.
	Meta Meta

	// PublishInterval is how often this node sends its own in-flight
	// figures to every other node: the figures that changed during the
	// last ResendCount intervals (loss repair), and all of them every
	// RefreshInterval. Default 50 ms.
	PublishInterval time.Duration
	// ChangeDelay is how often this node reads its own figures between
	// publishes. A figure that changed since it was last sent (a request
	// started or ended) is sent at the next read, so the other nodes
	// stop counting a request within ChangeDelay plus transit of its end;
	// changes within one ChangeDelay share one publish, so a node sends
	// at most one publish per ChangeDelay. At most PublishInterval
	// (equal: changes wait for the next publish). Default 5 ms.
	ChangeDelay time.Duration
	// ChangeBudget bounds the publishes of changes per second that every
	// router together sends to any one router: with n members, a node
	// sends changes at most once per max(ChangeDelay, (n-1)/ChangeBudget),
	// so a router's received packets stay bounded as the cluster grows
	// (changes wait a little longer and share a publish), while a small
	// cluster keeps ChangeDelay. Ticks (PublishInterval) are not counted.
	// Default 2,000 per second: ChangeDelay up to 11 routers, 25 ms at 50.
	ChangeBudget int
	// RefreshInterval is how often every figure is re-sent even when it did
	// not change (between refreshes only figures that changed during the
	// last ResendCount intervals are sent). Default 500 ms.
	RefreshInterval time.Duration
	// ResendCount is how many consecutive publishes repeat a changed figure,
	// so a lost UDP packet is repaired one interval later. Default 3.
	ResendCount int
	// ExpireAfter bounds the age of a remote figure: one not refreshed for
	// this long is ignored. Must exceed RefreshInterval. Default 2 s.
	ExpireAfter time.Duration
	// EngineExpireAfter bounds the age of a backend's engine metrics since
	// they were scraped. Default 5 s.
	EngineExpireAfter time.Duration

	// PushPullInterval is the period of memberlist's full state exchange
	// with a random member (anti-entropy). Default 2 s.
	PushPullInterval time.Duration
	// GossipInterval is the period of memberlist's membership gossip.
	// Default 100 ms.
	GossipInterval time.Duration
	// ProbeInterval, ProbeTimeout, SuspicionMult and
	// SuspicionMaxTimeoutMult tune failure detection (see memberlist). The
	// defaults (200 ms, 100 ms, 4, 3) declare a crashed node dead in about
	// one second in a small LAN cluster.
	ProbeInterval           time.Duration
	ProbeTimeout            time.Duration
	SuspicionMult           int
	SuspicionMaxTimeoutMult int
	// RejoinInterval is how often a node that is alone, or that lost
	// members to failure, tries the seeds and the failed members again.
	// Default 5 s.
	RejoinInterval time.Duration
	// LeaveTimeout bounds how long Close waits for the leave to be
	// broadcast. Default 2 s.
	LeaveTimeout time.Duration

	// SecretKey encrypts and authenticates all gossip (AES-GCM, 16, 24 or 32
	// bytes). Every node needs the same key. ExtraKeys are also accepted
	// when decrypting, for key rotation.
	SecretKey []byte
	ExtraKeys [][]byte
	// AllowPlaintext permits running without SecretKey on non-loopback
	// addresses. Without a key and without this, New refuses to start
	// unless both bind and advertise addresses are loopback.
	AllowPlaintext bool

	// Identity, when set, ties every figure to its sender: this node
	// signs what it publishes, and figures, engine metrics and health
	// verdicts from another node are accepted only when signed by a
	// certificate that proves that node's name. Its certificate must
	// prove NodeName. Without it any holder of SecretKey can speak for
	// any node (single-host loopback clusters, or an explicit insecure
	// choice).
	Identity Identity

	// Logger receives the Mesh's and memberlist's logs. Nil discards.
	Logger *slog.Logger
	// Registry, when non-nil, receives the Mesh's metrics.
	Registry prometheus.Registerer
}

// Meta is the metadata a node advertises. Encoded it must stay under 512
// bytes (memberlist's limit).
type Meta struct {
	AdminAddr string `json:"a,omitempty"` // host:port of the admin listener
	RaftAddr  string `json:"r,omitempty"` // host:port of the Raft transport
	Zone      string `json:"z,omitempty"` // failure domain
	Voter     bool   `json:"v,omitempty"` // wants a Raft vote
	Version   string `json:"b,omitempty"` // build version
	// Wire is the highest gossip message version this node speaks; set
	// by the Mesh.
	Wire uint8 `json:"w,omitempty"`
	// Ops is the newest set of Raft commands this node can apply
	// (node/cluster.CommandLevel); versions before it was advertised
	// send none (0). The leader writes a command only when every router
	// can apply it, so a rolling upgrade never halts an old router.
	Ops uint8 `json:"o,omitempty"`
	// Votes is 1 when this node counts another router's silence about a
	// backend as a healthy verdict (View.Health); set by the Mesh. A node
	// leaves settled zero figures out of its refreshes only while every
	// member advertises it: a node of an earlier version counts only
	// figures as verdicts, and must keep hearing every router's.
	Votes uint8 `json:"h,omitempty"`
}

// DefaultConfig returns a Config tuned for a LAN: failure detection in
// about a second, load figures every 50 ms.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:                host,
		BindAddr:                "0.0.0.0",
		BindPort:                defaultPort,
		PublishInterval:         50 * time.Millisecond,
		ChangeDelay:             5 * time.Millisecond,
		ChangeBudget:            2000,
		RefreshInterval:         500 * time.Millisecond,
		ResendCount:             3,
		ExpireAfter:             2 * time.Second,
		EngineExpireAfter:       5 * time.Second,
		PushPullInterval:        2 * time.Second,
		GossipInterval:          100 * time.Millisecond,
		ProbeInterval:           200 * time.Millisecond,
		ProbeTimeout:            100 * time.Millisecond,
		SuspicionMult:           4,
		SuspicionMaxTimeoutMult: 3,
		RejoinInterval:          5 * time.Second,
		LeaveTimeout:            2 * time.Second,
	}
}

// Validate reports the first problem with c, or nil.
func (c *Config) Validate() error {
	if c.NodeName == "" {
		return ErrNoNodeName
	}
	if err := checkName(c.NodeName); err != nil {
		return err
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("%w: port out of range", ErrInvalidConfig)
	}
	if c.BindAddr != "" {
		if _, err := netip.ParseAddr(c.BindAddr); err != nil {
			return fmt.Errorf("%w: bind address %q is not an IP address", ErrInvalidConfig, c.BindAddr)
		}
	}
	if c.AdvertiseAddr != "" {
		if _, err := netip.ParseAddr(c.AdvertiseAddr); err != nil {
			return fmt.Errorf("%w: advertise address %q is not an IP address", ErrInvalidConfig, c.AdvertiseAddr)
		}
	}
	pos := []struct {
		name string
		d    time.Duration
	}{
		{"PublishInterval", c.PublishInterval},
		{"ChangeDelay", c.ChangeDelay},
		{"RefreshInterval", c.RefreshInterval},
		{"ExpireAfter", c.ExpireAfter},
		{"EngineExpireAfter", c.EngineExpireAfter},
		{"PushPullInterval", c.PushPullInterval},
		{"GossipInterval", c.GossipInterval},
		{"ProbeInterval", c.ProbeInterval},
		{"ProbeTimeout", c.ProbeTimeout},
		{"RejoinInterval", c.RejoinInterval},
		{"LeaveTimeout", c.LeaveTimeout},
	}
	for _, p := range pos {
		if p.d <= 0 {
			return fmt.Errorf("%w: %s must be positive", ErrInvalidConfig, p.name)
		}
	}
	if c.ChangeDelay > c.PublishInterval {
		return fmt.Errorf("%w: ChangeDelay (%v) exceeds PublishInterval (%v)", ErrInvalidConfig, c.ChangeDelay, c.PublishInterval)
	}
	if c.RefreshInterval < c.PublishInterval {
		return fmt.Errorf("%w: RefreshInterval (%v) is shorter than PublishInterval (%v)", ErrInvalidConfig, c.RefreshInterval, c.PublishInterval)
	}
	if c.ExpireAfter <= c.RefreshInterval {
		return fmt.Errorf("%w: ExpireAfter (%v) must exceed RefreshInterval (%v)", ErrInvalidConfig, c.ExpireAfter, c.RefreshInterval)
	}
	if c.ProbeTimeout > c.ProbeInterval {
		return fmt.Errorf("%w: ProbeTimeout exceeds ProbeInterval", ErrInvalidConfig)
	}
	if c.ChangeBudget < 1 {
		return fmt.Errorf("%w: ChangeBudget must be at least 1", ErrInvalidConfig)
	}
	if c.ResendCount < 1 {
		return fmt.Errorf("%w: ResendCount must be at least 1", ErrInvalidConfig)
	}
	if c.SuspicionMult < 1 || c.SuspicionMaxTimeoutMult < 1 {
		return fmt.Errorf("%w: suspicion multipliers must be at least 1", ErrInvalidConfig)
	}
	for _, k := range append([][]byte{c.SecretKey}, c.ExtraKeys...) {
		if k == nil {
			continue
		}
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return ErrKeyLength
		}
	}
	if len(c.SecretKey) == 0 && len(c.ExtraKeys) > 0 {
		return fmt.Errorf("%w: ExtraKeys without SecretKey", ErrInvalidConfig)
	}
	if len(c.SecretKey) == 0 && !c.AllowPlaintext && !(isLoopback(c.BindAddr) && (c.AdvertiseAddr == "" || isLoopback(c.AdvertiseAddr))) {
		return ErrPlaintext
	}
	if _, err := encodeMeta(c.Meta); err != nil {
		return err
	}
	for _, j := range c.Join {
		if _, _, err := splitSeed(j, c.seedPort()); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) seedPort() int {
	if c.BindPort != 0 {
		return c.BindPort
	}
	return defaultPort
}

// isLoopback reports whether addr (an IP address or "localhost") is a
// loopback address. The empty string (bind to all) is not.
func isLoopback(addr string) bool {
	if addr == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(addr)
	return err == nil && a.IsLoopback()
}

// splitSeed splits a --join entry into host and port, applying defPort when
// the entry has none. Entries may hold several comma-separated seeds only
// at the flag level; here one entry is one seed.
func splitSeed(s string, defPort int) (string, int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", 0, fmt.Errorf("%w: empty join address", ErrInvalidConfig)
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		// No port: a bare host name, IPv4 or (possibly bracketed) IPv6.
		host = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		if strings.ContainsAny(host, "[]") {
			return "", 0, fmt.Errorf("%w: join address %q: %v", ErrInvalidConfig, s, err)
		}
		if !hostname.Valid(host) {
			return "", 0, fmt.Errorf("%w: join address %q: host must be an IP address or a DNS name", ErrInvalidConfig, s)
		}
		return host, defPort, nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w: join address %q: bad port", ErrInvalidConfig, s)
	}
	if host == "" {
		return "", 0, fmt.Errorf("%w: join address %q: no host", ErrInvalidConfig, s)
	}
	if !hostname.Valid(host) {
		return "", 0, fmt.Errorf("%w: join address %q: host must be an IP address or a DNS name", ErrInvalidConfig, s)
	}
	return host, port, nil
}
