// Package node is the composition root of one warmroute router: it reads
// the configuration, builds ring snapshots, and starts and stops the proxy
// (traffic listener) and the admin listener (metrics, status, route
// explainer) in a fixed order.
//
// Cluster concerns (gossip of load, Raft agreement on backends and routing
// config) are wired here and nowhere else: ring and proxy stay free of them.
package node
