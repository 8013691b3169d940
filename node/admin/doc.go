// Package admin is a router's admin API, on its own listener (not the
// traffic port): /metrics, /healthz, /status, the route explainer
// (/debug/route), the agreed backends and routing config (/v1/backends,
// /v1/config), the cluster view (/v1/cluster, where members this router's
// identity probes refuse show as refused, with the reason) and the
// certificate revocation list (/v1/revocations), and Client, the typed
// client the CLI uses.
//
// The Server reads the router through small interfaces declared here
// (Agreement, Router, Members) that the node's Raft member, proxy and
// gossip cluster satisfy. Writes go through Agreement.Apply; a follower
// forwards them to the leader's admin API (over HTTPS to a server that
// proves the leader's name when routers have certificates) and retries
// with jitter while there is no leader.
//
// Authentication: with a token, writes need it from anywhere and reads
// need it from other hosts; without one, writes are accepted from
// loopback only. A write another router forwarded is authorized by the
// router that forwarded it, when that router proves its name with its
// cluster certificate (checked against the revocation list at every
// request). A request that proved who sent it (the token, loopback, a
// router's certificate) promotes its connection out of the listener's
// pool of unproven connections (ConnContext, internal/limit).
package admin
