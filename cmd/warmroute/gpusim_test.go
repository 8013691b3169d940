package main

import (
	"context"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadtest/gpusim"
)

// TestGpusimLoRAFlags: --lora-modules and --instance-lora-modules take
// several values after them, as vLLM's --lora-modules does, or one per
// use of the flag, in both of vLLM's forms.
func TestGpusimLoRAFlags(t *testing.T) {
	t.Parallel()
	args := []string{
		"--enable-lora", "--lora-modules", "sql=/a/sql", `{"name":"chat","path":"/a/chat","base_model_name":"m"}`,
		"--max-loras", "2", "-lora-modules", "extra=/x",
		"--instance-lora-modules", "1:one=/one", `0:{"name":"zero","path":"/z"}`, "--instance-lora-modules=1:uno=/uno",
		"--allow-runtime-lora-updating", "--lora-load-time", "1s", "--lora-swap-time", "5ms", "--max-cpu-loras", "3",
	}
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := gpusimFlags(fs)
	if err := fs.Parse(expandListFlags(args)); err != nil || fs.NArg() > 0 {
		t.Fatalf("parse: %v, left %q", err, fs.Args())
	}
	m := s.model
	want := []gpusim.LoRAModule{{Name: "sql", Path: "/a/sql"}, {Name: "chat", Path: "/a/chat", BaseModelName: "m"}, {Name: "extra", Path: "/x"}}
	if !slices.Equal(m.LoRAModules, want) || !m.EnableLoRA || m.MaxLoRAs != 2 || m.MaxCPULoRAs != 3 ||
		!m.AllowRuntimeLoRAUpdating || m.LoRALoadTime.String() != "1s" || m.LoRASwapTime.String() != "5ms" {
		t.Fatalf("settings %+v", m)
	}
	if got := s.perInstance; len(got) != 2 || !slices.Equal(got[0], []gpusim.LoRAModule{{Name: "zero", Path: "/z"}}) ||
		!slices.Equal(got[1], []gpusim.LoRAModule{{Name: "one", Path: "/one"}, {Name: "uno", Path: "/uno"}}) {
		t.Fatalf("per instance %+v", got)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range [][]string{
		{"--lora-modules"},                               // no value
		{"--lora-modules", "sql"},                        // neither form
		{"--instance-lora-modules", "x:a=/a"},            // no index
		{"--instance-lora-modules", "a=/a"},              // no index either
		{"--instance-lora-modules", "+1:a=/a"},           // not digits
		{"--lora-modules", "a=/a", "--", "b=/b"},         // after --: an argument
		{"--instance-lora-modules", "99999999:a=/a"},     // an index out of any range
		{"--lora-modules", `{"name":"a","path":"/p"} x`}, // text after the JSON
	} {
		fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		gpusimFlags(fs)
		if err := fs.Parse(expandListFlags(tc)); err == nil && fs.NArg() == 0 {
			t.Errorf("%q accepted", tc)
		}
	}
	if got := expandListFlags([]string{"--model", "m", "--lora-modules", "a=/a", "b=/b", "--kv-blocks", "9"}); !slices.Equal(got,
		[]string{"--model", "m", "--lora-modules", "a=/a", "--lora-modules", "b=/b", "--kv-blocks", "9"}) {
		t.Fatalf("expand: %q", got)
	}
}

// TestGpusimLoRAStartErrors: the command refuses what vLLM refuses at
// start, with the reason.
func TestGpusimLoRAStartErrors(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		"--lora-modules sql=/a":                                      "--enable-lora",
		"--enable-lora --lora-modules sql=/a sql=/b":                 "given twice",
		"--enable-lora --max-loras 4 --max-cpu-loras 2":              "max cpu loras",
		"--enable-lora --instances 2 --instance-lora-modules 2:a=/a": "instance 2 of 2",
	} {
		err := cmdGpusim(context.Background(), append(strings.Fields(args), "--listen", "127.0.0.1:0"), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", args, err, want)
		}
	}
}
