//go:build race

package proxy

// raceEnabled: the race detector is on; sync.Pool then drops a quarter of
// what is put back, so pooled objects are allocated again now and then.
const raceEnabled = true
