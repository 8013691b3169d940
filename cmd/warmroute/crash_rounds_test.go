//go:build !integ

package main

// crashRounds is how many rounds TestE2ECrashRestart runs in `make test`
// (under a minute); `make integ` runs 20 (crash_integ_test.go).
const crashRounds = 3
