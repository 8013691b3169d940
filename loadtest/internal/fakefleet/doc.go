// Package fakefleet lets a test binary stand in for `warmroute gpusim` and
// `warmroute serve`, so the process handling of loadtest/fleet and the
// comparisons of loadtest/compare can be tested as real child processes.
//
// A test's TestMain calls TestMain, which runs the child its arguments name
// when the Env variable is set. The router stand-in is a plain reverse
// proxy implementing RANDOM, ROUND_ROBIN, LEAST_OUTSTANDING_REQUESTS and a
// simple PREFIX_AWARE (hash of the body's first PrefixLength bytes,
// overflow to the least loaded backend at the concurrency threshold); it
// sets the X-Warmroute-Backend and X-Warmroute-Decision headers as the real
// router does.
package fakefleet
