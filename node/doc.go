// Package node is the composition root of one warmroute router: it reads
// the configuration, builds ring snapshots, and starts and stops the proxy
// (traffic listener) and the admin listener (metrics, status, route
// explainer) in a fixed order.
//
// With ext_proc.listen set it also serves the gateway's endpoint picker
// (extproc.go, package proxy/extproc) beside the traffic listener, and
// with cluster.discovery_k8s_* the Raft leader finds backends in
// Kubernetes (k8s.go, package node/kube).
//
// Config holds the settings in sections, each one tagged type declared
// once where it is used: ring.Settings (routing), proxy.Limits,
// proxy.Upstream and proxy.Health (handed to the proxy whole), and the
// node's own ClusterConfig, Admin, Engine, Log, AccessLog, Tracing and
// Record. Their yaml, flag, help and env tags name each setting in the
// config file, on the command line, in --help and in
// docs/configuration.md.
//
// Cluster concerns (gossip of load, Raft agreement on backends and routing
// config) are wired here and nowhere else: ring and proxy stay free of them.
package node
