package main

import (
	"context"
	"errors"
	"flag"
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
		"tls":      {"create the cluster CA and router certificates; show one", cmdTLS},
		"version":  {"print the version", cmdVersion},
	}
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func cmdVersion(_ context.Context, _ []string, stdout, _ io.Writer) error {
	_, err := fmt.Fprintln(stdout, "warmroute", version)
	return err
}

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
	fmt.Fprintf(w, "\nRun 'warmroute <command> --help' for a command's flags.\n")
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
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "warmroute: unknown command %q\n\n", args[0])
		usage(stderr, cmds)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "warmroute %s: %v\n", args[0], err)
		return 1
	}
}
