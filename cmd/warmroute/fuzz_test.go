package main

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/ring"
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
		var got []backendspec.Spec
		if err := (backendsFlag{&got}).Set(v); err != nil {
			return
		}
		for _, b := range got {
			if b.URL == "" {
				t.Fatalf("accepted a backend without a URL from %q: %+v", v, b)
			}
		}
		var again []backendspec.Spec
		if err := (backendsFlag{&again}).Set(v); err != nil || len(again) != len(got) {
			t.Fatalf("%q: second parse differs: %v", v, err)
		}
	})
}

// FuzzSettingValue: `warmroute config set key=value` types each value as
// its setting takes it, or refuses it before sending anything: what it
// sends is accepted by the admin API's parser for that setting.
func FuzzSettingValue(f *testing.F) {
	for _, kv := range [][2]string{{"prefix_length", "8192"}, {"prefix_length", "x"}, {"load_factor", "1.25"},
		{"load_factor", "NaN"}, {"busy_is_full", "TRUE"}, {"busy_is_full", "1"}, {"strategy", "lor"},
		{"PrefixLength", "4096"}, {"nope", "1"}, {"concurrency_threshold", "1"}} {
		f.Add(kv[0], kv[1])
	}
	f.Fuzz(func(t *testing.T, key, v string) {
		val, err := settingValue(key, v)
		if err != nil {
			return
		}
		body, err := json.Marshal(map[string]any{key: val})
		if err != nil {
			t.Fatalf("%s=%q became %#v, which JSON cannot carry: %v", key, v, val, err)
		}
		info, _ := ring.LookupSetting(key)
		var s ring.Settings
		if err := json.Unmarshal(body[len(`{"`)+len(key)+len(`":`):len(body)-1], s.Field(info)); err != nil {
			t.Fatalf("%s=%q sent as %s, which the setting does not take: %v", key, v, body, err)
		}
	})
}
