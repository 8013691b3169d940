package proc

import (
	"strconv"
	"strings"
	"time"
)

// ServeArgs are the settings of a `warmroute serve` process that the
// tools and tests set. A zero field is left out, so the router's default
// applies. cmd/warmroute's TestServeArgsFlagTable checks every field
// against the real flag table.
type ServeArgs struct {
	Listen      string   // --listen
	AdminListen string   // --admin-listen
	Backends    []string // --backends, each "[id=]url[;zone=z][;weight=n]"

	Strategy             string  // --strategy
	PrefixLength         int     // --prefix-length
	ConcurrencyThreshold int     // --concurrency-threshold
	LoadFactor           float64 // --load-factor

	ReadTimeout  time.Duration // --read-timeout
	IdleTimeout  time.Duration // --idle-timeout
	WriteTimeout time.Duration // --write-timeout
	MaxConns     int           // --max-conns

	ConnectTimeout     time.Duration // --connect-timeout
	FirstByteTimeout   time.Duration // --first-byte-timeout
	StreamIdleTimeout  time.Duration // --stream-idle-timeout
	MaxConnsPerBackend int           // --max-conns-per-backend
	MaxConnWait        time.Duration // --max-conn-wait

	ProbePath     string        // --probe-path
	ProbeInterval time.Duration // --probe-interval
	// NoProbes turns active health checks off (an empty --probe-path); it
	// wins over ProbePath.
	NoProbes bool
	// NoEngineMetrics turns engine metrics scrapes off (an empty
	// --engine-metrics-path).
	NoEngineMetrics bool

	NodeName        string        // --node-name
	GossipListen    string        // --gossip-listen
	GossipAdvertise string        // --gossip-advertise
	RaftListen      string        // --raft-listen
	RaftAdvertise   string        // --raft-advertise
	Join            []string      // --join
	BootstrapExpect int           // --bootstrap-expect
	Voters          int           // --voters
	RaftTimeout     time.Duration // --raft-timeout
	DataDir         string        // --data-dir
	GossipKeyFile   string        // --gossip-key-file

	AdminTokenFile     string     // --admin-token-file
	AdminPublicMetrics bool       // --admin-public-metrics
	ClusterTLS         ClusterTLS // --cluster-tls-*

	LogLevel        string        // --log-level
	ShutdownTimeout time.Duration // --shutdown-timeout

	// Extra flags follow the others, so they win over them.
	Extra []string
}

// ClusterTLS are a router's cluster certificate, its key and the cluster
// CA (PEM files).
type ClusterTLS struct {
	CertFile, KeyFile, CAFile string
}

// Args returns the command line after the executable: "serve" and Flags.
func (a ServeArgs) Args() []string { return append([]string{"serve"}, a.Flags()...) }

// Flags returns the flags.
func (a ServeArgs) Flags() []string {
	var f flags
	f.str("listen", a.Listen)
	f.str("admin-listen", a.AdminListen)
	f.list("backends", a.Backends)
	f.str("strategy", a.Strategy)
	f.num("prefix-length", a.PrefixLength)
	f.num("concurrency-threshold", a.ConcurrencyThreshold)
	f.float("load-factor", a.LoadFactor)
	f.dur("read-timeout", a.ReadTimeout)
	f.dur("idle-timeout", a.IdleTimeout)
	f.dur("write-timeout", a.WriteTimeout)
	f.num("max-conns", a.MaxConns)
	f.dur("connect-timeout", a.ConnectTimeout)
	f.dur("first-byte-timeout", a.FirstByteTimeout)
	f.dur("stream-idle-timeout", a.StreamIdleTimeout)
	f.num("max-conns-per-backend", a.MaxConnsPerBackend)
	f.dur("max-conn-wait", a.MaxConnWait)
	if a.NoProbes {
		f = append(f, "--probe-path", "")
	} else {
		f.str("probe-path", a.ProbePath)
	}
	f.dur("probe-interval", a.ProbeInterval)
	if a.NoEngineMetrics {
		f = append(f, "--engine-metrics-path", "")
	}
	f.str("node-name", a.NodeName)
	f.str("gossip-listen", a.GossipListen)
	f.str("gossip-advertise", a.GossipAdvertise)
	f.str("raft-listen", a.RaftListen)
	f.str("raft-advertise", a.RaftAdvertise)
	f.list("join", a.Join)
	f.num("bootstrap-expect", a.BootstrapExpect)
	f.num("voters", a.Voters)
	f.dur("raft-timeout", a.RaftTimeout)
	f.str("data-dir", a.DataDir)
	f.str("gossip-key-file", a.GossipKeyFile)
	f.str("admin-token-file", a.AdminTokenFile)
	f.on("admin-public-metrics", a.AdminPublicMetrics)
	f.str("cluster-tls-cert-file", a.ClusterTLS.CertFile)
	f.str("cluster-tls-key-file", a.ClusterTLS.KeyFile)
	f.str("cluster-tls-ca-file", a.ClusterTLS.CAFile)
	f.str("log-level", a.LogLevel)
	f.dur("shutdown-timeout", a.ShutdownTimeout)
	return append(f, a.Extra...)
}

// GpusimArgs are the settings of a `warmroute gpusim` process that the
// tools and tests set; a zero field is left out. cmd/warmroute's
// TestGpusimArgsFlagTable checks every field against the real flags.
type GpusimArgs struct {
	Instances  int     // --instances
	Listen     string  // --listen HOST:FIRSTPORT
	NamePrefix string  // --name-prefix
	KVBlocks   int     // --kv-blocks
	TimeScale  float64 // --time-scale
	// Extra flags follow the others, so they win over them.
	Extra []string
}

// Args returns the command line after the executable: "gpusim" and Flags.
func (a GpusimArgs) Args() []string { return append([]string{"gpusim"}, a.Flags()...) }

// Flags returns the flags.
func (a GpusimArgs) Flags() []string {
	var f flags
	f.num("instances", a.Instances)
	f.str("listen", a.Listen)
	f.str("name-prefix", a.NamePrefix)
	f.num("kv-blocks", a.KVBlocks)
	f.float("time-scale", a.TimeScale)
	return append(f, a.Extra...)
}

// flags renders "--name value" pairs, skipping zero values.
type flags []string

func (f *flags) str(name, v string) {
	if v != "" {
		*f = append(*f, "--"+name, v)
	}
}

func (f *flags) list(name string, v []string) { f.str(name, strings.Join(v, ",")) }

func (f *flags) num(name string, v int) {
	if v != 0 {
		f.str(name, strconv.Itoa(v))
	}
}

func (f *flags) float(name string, v float64) {
	if v != 0 {
		f.str(name, strconv.FormatFloat(v, 'g', -1, 64))
	}
}

func (f *flags) dur(name string, v time.Duration) {
	if v != 0 {
		f.str(name, v.String())
	}
}

func (f *flags) on(name string, v bool) {
	if v {
		*f = append(*f, "--"+name)
	}
}
