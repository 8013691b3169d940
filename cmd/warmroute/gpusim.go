package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/loadtest/gpusim"
)

// gpusimSettings are the settings of `warmroute gpusim`.
type gpusimSettings struct {
	instances          int
	listen, namePrefix string
	model              gpusim.Config
	// perInstance holds the adapters of --instance-lora-modules.
	perInstance map[int][]gpusim.LoRAModule
}

// gpusimFlags binds every gpusim flag to the settings it returns, which
// start from the defaults.
func gpusimFlags(fs *flag.FlagSet) *gpusimSettings {
	s := &gpusimSettings{model: gpusim.DefaultConfig(), perInstance: map[int][]gpusim.LoRAModule{}}
	fs.IntVar(&s.instances, "instances", 1, "number of instances, served on consecutive ports")
	fs.StringVar(&s.listen, "listen", "127.0.0.1:8000", "HOST:FIRSTPORT; instance i listens on FIRSTPORT+i (port 0: any free ports)")
	fs.StringVar(&s.namePrefix, "name-prefix", "gpu-", "instance i is named PREFIX+i (X-Gpusim-Instance header)")
	s.model.BindFlags(fs)
	fs.Var(instanceLoRAFlag{s.perInstance}, "instance-lora-modules",
		"LoRA adapters served from the start by one instance only: I:name=path or I:{JSON} (I the instance's index); repeat the flag or list several after it (needs --enable-lora)")
	return s
}

// instanceLoRAFlag adds one --instance-lora-modules entry per use.
type instanceLoRAFlag struct{ mods map[int][]gpusim.LoRAModule }

func (f instanceLoRAFlag) String() string { return "" }

func (f instanceLoRAFlag) Set(v string) error {
	idx, mod, ok := strings.Cut(v, ":")
	i, err := strconv.Atoi(idx)
	if !ok || err != nil || i < 0 || i > 65535 || strings.TrimLeft(idx, "0123456789") != "" {
		return fmt.Errorf("%q: want INDEX:MODULE, e.g. 1:sql=/adapters/sql", v)
	}
	n := 0
	for _, ms := range f.mods {
		n += len(ms)
	}
	if n >= gpusim.MaxLoRAAdapters {
		return fmt.Errorf("at most %d instance LoRA modules", gpusim.MaxLoRAAdapters)
	}
	m, err := gpusim.ParseLoRAModule(mod)
	if err != nil {
		return err
	}
	f.mods[i] = append(f.mods[i], m)
	return nil
}

// listFlags are the flags that take several values after them, as vLLM's
// --lora-modules does (argparse nargs='+').
var listFlags = []string{"lora-modules", "instance-lora-modules"}

// expandListFlags rewrites "--lora-modules a b" as "--lora-modules a
// --lora-modules b": every argument after such a flag up to the next one
// that starts with "-" is one more value of it. Arguments after "--" are
// left alone.
func expandListFlags(args []string) []string {
	out := make([]string, 0, len(args))
	cur, values := "", 0
	for i, a := range args {
		if cur != "" && !strings.HasPrefix(a, "-") {
			if values > 0 {
				out = append(out, "--"+cur)
			}
			out = append(out, a)
			values++
			continue
		}
		cur, values = "", 0
		if a == "--" {
			return append(out, args[i:]...)
		}
		out = append(out, a)
		name := strings.TrimLeft(a, "-")
		if dashes := len(a) - len(name); (dashes == 1 || dashes == 2) && slices.Contains(listFlags, name) {
			cur = name
		}
	}
	return out
}

// envTrue reads a vLLM boolean environment variable: "1" or "true" in any
// case, blanks around it ignored.
func envTrue(name string) bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(name)))
	return v == "1" || v == "true"
}

// cmdGpusim serves simulated vLLM GPU instances until ctx is cancelled.
func cmdGpusim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	set := gpusimFlags(fs)
	usage := "usage: warmroute gpusim [flags]\n\n" +
		"Serves N simulated vLLM instances (OpenAI API, SageMaker /invocations and /ping,\n" +
		"vLLM metrics) with a prefix KV cache and a calibrated latency model, and LoRA\n" +
		"adapters with --enable-lora. VLLM_ALLOW_RUNTIME_LORA_UPDATING=true serves the\n" +
		"runtime load and unload endpoints, as --allow-runtime-lora-updating does.\n" +
		"See docs/gpusim.md for the model and its defaults.\n\nflags:\n"
	if err := parseCommand(fs, expandListFlags(args), usage); err != nil {
		return err // flag.ErrHelp after printing usage for -h/--help
	}
	if envTrue("VLLM_ALLOW_RUNTIME_LORA_UPDATING") {
		set.model.AllowRuntimeLoRAUpdating = true
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
		InstanceLoRAModules: set.perInstance,
	})
	if err != nil {
		return err
	}
	for i, u := range fleet.URLs() {
		in := fleet.Instances()[i]
		if ads := in.LoRAAdapters(); len(ads) > 0 {
			fmt.Fprintf(stdout, "gpusim: %s LoRA adapters: %s\n", in.Name(), strings.Join(ads, ", "))
		}
		fmt.Fprintf(stdout, "gpusim: %s serving %s at %s\n", in.Name(), set.model.Model, u)
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "gpusim: shutting down")
	if err := fleet.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
