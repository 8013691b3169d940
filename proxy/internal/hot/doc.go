// Package hot finds the prompt prefixes that carry more of a router's
// traffic than one backend should take: the candidates for splitting (see
// ring.Splits).
//
// A Counter takes every routed request's block-chain keys (Add, lock-free:
// two rows of atomic counters, a count-min sketch) and, each time its owner
// calls Rotate, says which prefixes to split: those whose share of the
// requests is at least one backend's fair share (1/backends), keeping a
// split until its share falls below half of that. Counts decay by a quarter
// at every Rotate, so the Counter follows traffic over the last four or so
// rotations.
package hot
