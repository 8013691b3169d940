// Package fleet starts a local fleet as child processes of one executable:
// a gpusim process serving N simulated GPU instances on consecutive
// loopback ports, and K router processes in front of them. It is how a
// comparison gets a cold fleet for every run, and how `warmroute demo`
// runs without any set-up.
//
// Children run under loadtest/proc: in their own process groups (so a
// Ctrl-C in the terminal reaches only the parent, which then stops them in
// order) and, on Linux, die with the parent if it is killed. Close sends
// SIGTERM to each group, then SIGKILL after a grace period, and waits: no
// child outlives a Fleet. Routers in one cluster stop one at a time, the
// Raft leader last, each after the leader removed the one before, as an
// operator would scale a cluster down, so that none logs the others'
// departure as a failure. Their command lines come from proc.GpusimArgs
// and proc.ServeArgs.
package fleet
