package main

import (
	"errors"
	"flag"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/node"
)

// FuzzServeConfig feeds arbitrary command lines and one WARMROUTE_*
// variable to serve's configuration loader: it never panics, and whatever
// it accepts is a valid configuration.
func FuzzServeConfig(f *testing.F) {
	f.Add("--listen\x00127.0.0.1:0\x00--backends\x00http://10.0.0.1:8000,gpu=http://10.0.0.2:8000;zone=a;weight=2", "PREFIX_LENGTH", "8192")
	f.Add("--RoutingStrategy\x00PREFIX_AWARE\x00--PrefixLength\x001024\x00--ConcurrencyThreshold\x003", "STRATEGY", "RANDOM")
	f.Add("--strategy=LEAST_OUTSTANDING_REQUESTS\x00--load-factor=1.25", "MAX_BODY_SIZE", "64MiB")
	f.Add("--node-name\x00r1\x00--gossip-listen\x00127.0.0.1:7946\x00--join\x00a,b", "ZONE_AWARE", "true")
	f.Add("--prefix-length\x00-1", "CONCURRENCY_THRESHOLD", "x")
	f.Add("stray", "BACKENDS", ",,,")
	f.Fuzz(func(t *testing.T, args, env, val string) {
		// --config would read a file named by the input (a device, a
		// large file): the loader's file handling has FuzzLoadConfig.
		if strings.Contains(args, "config") || strings.Contains(strings.ToLower(env), "config") {
			return
		}
		if env != "" && strings.IndexFunc(env, func(r rune) bool { return !(r >= 'A' && r <= 'Z' || r == '_' || r >= '0' && r <= '9') }) < 0 &&
			!strings.ContainsRune(val, 0) {
			t.Setenv("WARMROUTE_"+env, val)
		}
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\x00")
		}
		cfg, err := loadServeConfig(argv, io.Discard)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return
			}
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted %q (env %s=%q) but the result is invalid: %v", argv, env, val, err)
		}
	})
}

// FuzzBackendsFlag: --backends never panics, and every spec it accepts
// parses again to the same backend.
func FuzzBackendsFlag(f *testing.F) {
	f.Add("http://10.0.0.1:8000,http://10.0.0.2:8000")
	f.Add("gpu-1=http://gpu-1.vllm:8000;zone=us-east-1a;weight=2, gpu-2=https://gpu-2:443")
	f.Add(",, ,")
	f.Add("a=b=c,;zone=")
	f.Fuzz(func(t *testing.T, v string) {
		var got []node.BackendSpec
		if err := (backendsFlag{&got}).Set(v); err != nil {
			return
		}
		for _, b := range got {
			if b.URL == "" {
				t.Fatalf("accepted a backend without a URL from %q: %+v", v, b)
			}
		}
		var again []node.BackendSpec
		if err := (backendsFlag{&again}).Set(v); err != nil || len(again) != len(got) {
			t.Fatalf("%q: second parse differs: %v", v, err)
		}
	})
}

// FuzzConfigValue: `warmroute config set key=value` sends integers as
// JSON numbers, "true"/"false" as booleans, other numbers as floats and
// anything else as the string itself.
func FuzzConfigValue(f *testing.F) {
	for _, s := range []string{"1", "0", "8192", "-3", "1.25", "true", "FALSE", "t", "PREFIX_AWARE", "", "1e3", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got := configValue(v)
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			if got != i {
				t.Fatalf("%q is the integer %d but became %#v", v, i, got)
			}
			return
		}
		switch g := got.(type) {
		case bool:
			if !strings.EqualFold(v, strconv.FormatBool(g)) {
				t.Fatalf("%q became the boolean %v", v, g)
			}
		case float64:
			// Only finite numbers: JSON has no NaN or infinity.
			if fl, err := strconv.ParseFloat(v, 64); err != nil || fl != g || math.IsInf(g, 0) {
				t.Fatalf("%q became the number %v", v, g)
			}
		case string:
			if g != v {
				t.Fatalf("%q became the string %q", v, g)
			}
		default:
			t.Fatalf("%q became %#v", v, got)
		}
	})
}
