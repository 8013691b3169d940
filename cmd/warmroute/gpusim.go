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

// gpusimSettings are the settings of `warmroute gpusim`.
type gpusimSettings struct {
	instances          int
	listen, namePrefix string
	model              gpusim.Config
}

// gpusimFlags binds every gpusim flag to the settings it returns, which
// start from the defaults.
func gpusimFlags(fs *flag.FlagSet) *gpusimSettings {
	s := &gpusimSettings{model: gpusim.DefaultConfig()}
	fs.IntVar(&s.instances, "instances", 1, "number of instances, served on consecutive ports")
	fs.StringVar(&s.listen, "listen", "127.0.0.1:8000", "HOST:FIRSTPORT; instance i listens on FIRSTPORT+i (port 0: any free ports)")
	fs.StringVar(&s.namePrefix, "name-prefix", "gpu-", "instance i is named PREFIX+i (X-Gpusim-Instance header)")
	s.model.BindFlags(fs)
	return s
}

// cmdGpusim serves simulated vLLM GPU instances until ctx is cancelled.
func cmdGpusim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	set := gpusimFlags(fs)
	usage := "usage: warmroute gpusim [flags]\n\n" +
		"Serves N simulated vLLM instances (OpenAI API, SageMaker /invocations and /ping,\n" +
		"vLLM metrics) with a prefix KV cache and a calibrated latency model.\n" +
		"See docs/gpusim.md for the model and its defaults.\n\nflags:\n"
	if err := parseCommand(fs, args, usage); err != nil {
		return err // flag.ErrHelp after printing usage for -h/--help
	}
	host, portStr, err := net.SplitHostPort(set.listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", set.listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--listen %q: bad port: %w", set.listen, err)
	}
	fleet, err := gpusim.StartFleet(ctx, gpusim.FleetConfig{
		N: set.instances, ListenHost: host, FirstPort: port, NamePrefix: set.namePrefix, Instance: set.model,
	})
	if err != nil {
		return err
	}
	for i, u := range fleet.URLs() {
		fmt.Fprintf(stdout, "gpusim: %s serving %s at %s\n", fleet.Instances()[i].Name(), set.model.Model, u)
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "gpusim: shutting down")
	if err := fleet.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
