// Package hot finds the prompt prefixes that carry more of a router's
// traffic than one backend should take: the candidates for splitting (see
// ring.Splits).
//
// A Counter takes every routed request's block-chain keys (Add, lock-free:
// two rows of atomic counters, a count-min sketch) and, each time its owner
// calls Rotate, reports the candidates with their counts: the prefixes in
// use as splits, and those whose share of the requests is at least one
// backend's fair share (1/backends). It does not decide: a share says
// nothing of whether the prefix's owner keeps up. The Raft leader adds
// every router's counts up and splits a candidate only while its owner is
// pressed (node/splits.go). Counts decay by a quarter at every Rotate, so
// the Counter follows traffic over the last four or so rotations.
package hot
