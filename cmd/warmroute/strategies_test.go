package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadtest/fleet"
	"github.com/warmroute/warmroute/ring"
)

// TestStrategiesReachCLI walks ring's strategy table through the command
// line: serve's --strategy (and its SageMaker alias) lists every strategy
// in its help and takes each name, as 'admin config set' does; the demo
// lists each in its help, plans a run under each, and under all of them
// with --strategies all, where its notes name each strategy the default
// leaves out.
func TestStrategiesReachCLI(t *testing.T) {
	fs, cfg := boundFlags(t)
	f, alias := fs.Lookup("strategy"), fs.Lookup("RoutingStrategy")
	if f == nil || alias == nil {
		t.Fatal("serve has no --strategy or --RoutingStrategy")
	}
	if want := "routing strategy: " + ring.StrategyList(); f.Usage != want {
		t.Errorf("--strategy's help %q, want %q", f.Usage, want)
	}
	var help, errs bytes.Buffer
	if err := cmdDemo(context.Background(), []string{"--help"}, &help, &errs); err == nil {
		t.Fatal("demo --help ran a demo")
	}
	demoHelp := help.String() + errs.String()
	var out bytes.Buffer
	if err := cmdDemo(context.Background(), []string{"--strategies", "all", "--workloads", "rag", "--dry-run"}, &out, &errs); err != nil {
		t.Fatalf("demo --strategies all --dry-run: %v\n%s", err, errs.String())
	}
	if want := fmt.Sprintf("demo: %d runs:", len(fleet.Strategies())); !strings.Contains(out.String(), want) {
		t.Errorf("demo --strategies all plans no %q:\n%s", want, out.String())
	}
	adds := demoAllAdds()
	for _, info := range ring.Strategies() {
		for _, fl := range []string{"strategy", "RoutingStrategy"} {
			fs, cfg = boundFlags(t)
			if err := fs.Parse([]string{"--" + fl, strings.ToLower(info.Name)}); err != nil || cfg.Routing.Strategy != info.Strategy {
				t.Errorf("--%s %s: %v, strategy %v", fl, strings.ToLower(info.Name), err, cfg.Routing.Strategy)
			}
		}
		word := regexp.MustCompile(`\b` + regexp.QuoteMeta(info.Name) + `\b`)
		if !word.MatchString(f.Usage) {
			t.Errorf("--strategy's help does not list %s", info.Name)
		}
		if v, err := settingValue("strategy", strings.ToLower(info.Name)); err != nil || v != info.Name {
			t.Errorf("config set strategy=%s: %v, %v", strings.ToLower(info.Name), v, err)
		}
		if !word.MatchString(demoHelp) {
			t.Errorf("demo --help does not list %s:\n%s", info.Name, demoHelp)
		}
		out.Reset()
		if err := cmdDemo(context.Background(), []string{"--strategies", strings.ToLower(info.Name), "--workloads", "rag", "--dry-run"}, &out, &errs); err != nil {
			t.Errorf("demo --strategies %s: %v", strings.ToLower(info.Name), err)
		}
		if !slices.Contains(demoStrategies(), info.Name) && !word.MatchString(adds) {
			t.Errorf("%s is neither a default of the demo nor in what --strategies all adds (%s)", info.Name, adds)
		}
	}
}
