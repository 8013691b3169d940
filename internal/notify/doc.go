// Package notify wakes subscribers after a change without ever blocking
// the side that changed something.
//
// A Hub hands each subscriber a channel with a buffer of one. Notify puts
// a value in every channel that has room and skips the others, so a slow
// reader sees one pending notification for many changes and then reads
// the current state itself (an atomic snapshot, a View, a State). Close
// closes every channel; a later Subscribe gets a channel that is already
// closed, so a reader's loop ends either way.
//
// gossip.Mesh (View changes) and cluster.Agreement (applied Raft state)
// notify their subscribers through a Hub, and so do the fakes that stand
// in for them in tests. The package imports the standard library only.
package notify
