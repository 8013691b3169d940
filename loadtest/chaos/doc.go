// Package chaos injects faults into a running warmroute cluster under
// steady load and measures how routing holds up: client errors, agreement
// of the routers' route explainers, time to reconverge, the fraction of
// prefixes that move, and the dip and recovery of the KV-cache hit rate.
//
// One engine drives two kinds of Target: local child processes on
// loopback (routers and gpusim instances; a kill is SIGKILL, a pause
// SIGSTOP, a partition iptables rules on the routers' uids) and the
// three-zone docker-compose stack of deploy/compose (docker kill, pause,
// network disconnect, compose up).
//
// While a fault runs, three loops sample the cluster:
//
//   - load: open-loop Poisson requests of a workload, each to one router
//     in turn as an L4 load balancer would spread them (a connection
//     refused before anything was sent goes to the next router, as such a
//     balancer retries). Every request is recorded: router, backend,
//     decision and epoch headers, status, and whether the stream completed.
//   - probe: every ProbeInterval a rotating batch of a fixed prompt set is
//     sent to every router's /debug/route explainer; agreement is the
//     fraction of those prompts on which every answering router picks the
//     same backend. Full snapshots of the prompt set before and after a
//     change give the fraction of prefixes that moved.
//   - kv: every KVInterval the backends' vLLM prefix-cache counters are
//     scraped; the fleet's hit rate over sliding windows gives the dip and
//     the time back to the pre-fault level.
//
// The arithmetic (agreement, reconvergence, movement, hit-rate dip, error
// classification) is pure and lives in measure.go. Everything the engine
// starts is stopped when Run returns, also on errors and cancellation.
package chaos
