// Package limit bounds the connections a listener holds: at most Max at
// once and at most PerIP from one remote address. A connection over
// either bound is closed as soon as it is accepted, so a flood costs
// file descriptors for an instant, not memory for as long as the flood
// lasts, and never blocks Accept for the connections within the bounds.
//
// The Raft, gossip and admin listeners use it; the traffic listener has
// its own cap (--max-conns) that answers 503 first.
package limit
