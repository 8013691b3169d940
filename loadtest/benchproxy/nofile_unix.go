//go:build unix

package main

import (
	"fmt"
	"syscall"
)

// raiseNoFile raises this process's RLIMIT_NOFILE soft limit to its hard
// limit (children inherit it: an explicit Setrlimit stops the Go runtime
// from restoring the old soft limit in them) and fails when the hard limit
// is below need.
func raiseNoFile(need uint64) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	rl.Cur = rl.Max
	hard := uint64(rl.Max) // int64 on some systems
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return hard, fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", hard, err)
	}
	if hard < need {
		return hard, fmt.Errorf("the open-file limit is %d (hard limit, RLIMIT_NOFILE) and the largest -open-streams count needs %d in the proxy (two per stream and a margin): raise the hard limit (ulimit -Hn, as root, or the container's nofile limit) or open fewer streams",
			hard, need)
	}
	return hard, nil
}
