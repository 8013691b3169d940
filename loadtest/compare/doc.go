// Package compare runs the same seeded workloads under several routing
// strategies, each against a cold fleet started for that run alone, and
// collects one Summary per (workload, strategy). It is the engine of
// `warmroute demo`.
package compare
