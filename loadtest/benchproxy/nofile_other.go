//go:build !unix

package main

import "errors"

// raiseNoFile is not available here: the open-streams phase needs a unix
// system.
func raiseNoFile(uint64) (uint64, error) {
	return 0, errors.New("the open-streams phase needs a unix system (RLIMIT_NOFILE)")
}
