package chaos

import "context"

// Router is one router node of a target.
type Router struct {
	Name     string // node name, as Raft and /v1/cluster call it
	URL      string // traffic: http://host:port
	AdminURL string // admin API and /debug/route: https://host:port with cluster TLS, else http://
}

// Backend is one GPU instance of a target.
type Backend struct {
	ID         string // the id the routers know it by
	URL        string // its URL as the routers reach it (for re-adding it)
	Zone       string
	MetricsURL string // its Prometheus /metrics as this process reaches it
}

// Target is a cluster the engine can break. Names are stable for the life
// of the target; addresses of backends may change after a restart, so the
// engine asks Backends again after one.
type Target interface {
	// Name is "local" or "compose".
	Name() string
	// Start brings the cluster up and returns once every router answers.
	Start(ctx context.Context) error
	Routers() []Router
	Backends() []Backend
	// Admin says how to reach the admin APIs: the bearer token, and the
	// TLS client configuration when they serve HTTPS (cluster TLS).
	Admin() AdminAccess

	KillRouter(ctx context.Context, name string) error
	// StartRouter starts a killed router again with its identity and data.
	StartRouter(ctx context.Context, name string) error
	PauseRouter(ctx context.Context, name string) error
	ResumeRouter(ctx context.Context, name string) error
	// CanPartition returns nil when PartitionRouter works here, else why not.
	CanPartition() error
	// PartitionRouter cuts the router off from the other routers (clients
	// still reach it); HealRouter undoes it.
	PartitionRouter(ctx context.Context, name string) error
	HealRouter(ctx context.Context, name string) error
	KillBackend(ctx context.Context, id string) error
	StartBackend(ctx context.Context, id string) error
	// StopAll stops every router and backend gracefully; StartAll starts
	// them again (routers with their data).
	StopAll(ctx context.Context) error
	StartAll(ctx context.Context) error

	// Describe says in one line what runs where (for the report).
	Describe() string
	// Close stops and removes everything Start made. Safe to call twice.
	Close() error
}
