package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/warmroute/warmroute/loadtest/gpusim"
)

// cmdGpusim serves simulated vLLM GPU instances until ctx is cancelled.
func cmdGpusim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("instances", 1, "number of instances, served on consecutive ports")
	listen := fs.String("listen", "127.0.0.1:8000", "HOST:FIRSTPORT; instance i listens on FIRSTPORT+i (port 0: any free ports)")
	prefix := fs.String("name-prefix", "gpu-", "instance i is named PREFIX+i (X-Gpusim-Instance header)")
	cfg := gpusim.DefaultConfig()
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: warmroute gpusim [flags]\n\n"+
			"Serves N simulated vLLM instances (OpenAI API, SageMaker /invocations and /ping,\n"+
			"vLLM metrics) with a prefix KV cache and a calibrated latency model.\n"+
			"See docs/gpusim.md for the model and its defaults.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err // flag.ErrHelp after printing usage for -h/--help
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", *listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--listen %q: bad port: %w", *listen, err)
	}
	fleet, err := gpusim.StartFleet(ctx, gpusim.FleetConfig{
		N: *n, ListenHost: host, FirstPort: port, NamePrefix: *prefix, Instance: cfg,
	})
	if err != nil {
		return err
	}
	for i, u := range fleet.URLs() {
		fmt.Fprintf(stdout, "gpusim: %s serving %s at %s\n", fleet.Instances()[i].Name(), cfg.Model, u)
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "gpusim: shutting down")
	if err := fleet.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
