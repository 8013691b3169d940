// Package proc supervises the child processes of warmroute's tools and
// end-to-end tests (routers, gpusim instances, proxies under benchmark),
// and builds the command lines of `warmroute serve` and `warmroute gpusim`
// from typed settings.
//
// Start runs a command in its own process group, so that a Ctrl-C in the
// terminal reaches only the parent, which then stops its children in
// order; on Linux the child also dies with the parent (Pdeathsig), and may
// run under another uid. Its standard output and error go to a Tail, a
// bounded buffer that may be read while it is written, and optionally to a
// log file. WaitReady polls a readiness check (HTTPCheck: a GET answering
// 200) until it passes, the process exits or a deadline passes; its errors
// carry the end of the process's output. Stop sends SIGTERM to the group,
// SIGKILL after a grace period to whatever is left of it, waits and
// reports the exit; Kill, Pause and Continue are what a chaos suite needs.
// Every Process owns one goroutine, which ends when the process has exited
// and been reaped: Stop or Kill ends it.
//
// ServeArgs and GpusimArgs render the flags of `warmroute serve` and
// `warmroute gpusim`; cmd/warmroute's TestServeArgsFlagTable and
// TestGpusimArgsFlagTable parse every field through the real flag tables,
// so a renamed flag fails there rather than at run time. SplitArgs reads
// the extra flags a user passes on one command-line value (--gpusim-args,
// --router-args, --warmroute-args): words separated by blanks, with shell
// quoting.
package proc
