//go:build integ

package main

// crashRounds is how many rounds TestE2ECrashRestart runs in `make integ`
// (the integ build tag).
const crashRounds = 20
