package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. It returns when its work is done or ctx is
// cancelled (Ctrl-C, SIGTERM).
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"serve":    {"run a router node", cmdServe},
		"gpusim":   {"serve simulated vLLM GPU instances", cmdGpusim},
		"loadtest": {"drive an OpenAI-compatible endpoint and report", cmdLoadtest},
		"demo":     {"compare routing strategies on a local fleet", cmdDemo},
		"trace":    {"generate a Mooncake-format trace, or print a trace's offline hit-rate bounds", cmdTrace},
		"chaos":    {"fault-inject a cluster under load and measure routing stability", cmdChaos},
		"status":   {"show a cluster's members, leader, epoch and backends", cmdStatus},
		"backends": {"list, add, remove or drain backends", cmdBackends},
		"config":   {"read or change the routing config", cmdConfig},
		"route":    {"explain where a request would be routed and why, on one router or several", cmdRoute},
		"tls":      {"create the cluster CA and router certificates; show one; revoke one", cmdTLS},
		"version":  {"print the version and build information (also --version)", cmdVersion},
	}
}

// version is set at build time with -ldflags "-X main.version=...", and
// commit, the full commit id, with "-X main.commit=..." (the Makefile sets
// both; Go's own VCS stamp, when the build has one, names the commit too).
var (
	version = "dev"
	commit  = ""
)

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "usage: warmroute <command> [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'warmroute <command> --help' for a command's flags; flags may follow arguments.\n")
	fmt.Fprintf(w, "Durations take a unit: 500ms, 2s, 5m. Exit status: 0 ok, 1 failed, 2 bad usage.\n")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	c, ok := cmds[args[0]]
	if !ok {
		names := make([]string, 0, len(cmds))
		for n := range cmds {
			names = append(names, n)
		}
		if c := closest(args[0], names); c != "" {
			fmt.Fprintf(stderr, "warmroute: unknown command %q (did you mean %s?)\n\n", args[0], c)
		} else {
			fmt.Fprintf(stderr, "warmroute: unknown command %q\n\n", args[0])
		}
		usage(stderr, cmds)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, args[1:], stdout, stderr)
	code := exitCode(err)
	if code != 0 {
		fmt.Fprintf(stderr, "warmroute %s: %v\n", args[0], err)
	}
	return code
}
