package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The open phase's engines (-open-engine): the stub, or gpusim.
const (
	engineStub   = "stub"
	engineGpusim = "gpusim"
)

// gpusimOpenArgs are the flags of one gpusim instance for n open streams
// over backends instances: a decode step every gap (one token per stream
// per step, however many run), the first token prefill after the request,
// room for all n streams to run at once on any one instance and to hold
// their KV blocks (a proxy that hashes the body need not spread them
// evenly), so the engine neither queues nor evicts and streams as vLLM
// does: one HTTP chunk per token, then the finish reason and the usage.
func gpusimOpenArgs(addr string, n int, gap, prefill time.Duration) proc.GpusimArgs {
	return proc.GpusimArgs{Instances: 1, Listen: addr, Extra: []string{
		"--model", benchModel,
		"--itl-base", gap.String(),
		"--itl-per-seq", "0",
		"--overhead", prefill.String(),
		"--prefill-tokens-per-sec", "1e9",
		"--max-num-seqs", strconv.Itoa(max(n, 1)),
		"--max-num-batched-tokens", strconv.Itoa(1 << 24),
		"--kv-blocks", strconv.Itoa(max(84000, 128*n)),
	}}
}

// useGpusim starts o.Backends gpusim processes (warmroute's own gpusim, on
// the generator's CPUs) sized for the phase's largest stream count, and
// points the phase's streams and proxies at them: the streamed bodies ask
// for o.OpenChunks tokens and the usage chunk, as an OpenAI client does;
// the events are counted, not timed.
func (env *openEnv) useGpusim(ctx context.Context, o options, n int) error {
	addrs, err := proc.FreeAddrs("127.0.0.1", o.Backends)
	if err != nil {
		return err
	}
	ready := workload{BodySize: o.BodySize, Prefixes: 1, Suffixes: 1, MaxTokens: 1}
	readyBodies, err := ready.bodies()
	if err != nil {
		return err
	}
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		args := gpusimOpenArgs(a, n, o.OpenGap, o.StreamPrefill)
		p, err := env.cs.start("gpusim-"+strconv.Itoa(i), o.Taskset, o.GenCPUs, o.Nice, append([]string{o.Warmroute}, args.Args()...)...)
		if err != nil {
			return err
		}
		urls[i] = "http://" + a
		if err := waitReady(ctx, p, urls[i], readyBodies[0], 15*time.Second); err != nil {
			return fmt.Errorf("gpusim %s: %w", a, err)
		}
	}
	bodies, err := workload{BodySize: o.BodySize, Prefixes: o.Prefixes, Suffixes: 1, Stream: true,
		MaxTokens: o.OpenChunks, Usage: true}.bodies()
	if err != nil {
		return err
	}
	env.stubs, env.bodies, env.readyBody, env.untimed = addrs, bodies, readyBodies[0], true
	env.serve.Backends = urls
	return nil
}
