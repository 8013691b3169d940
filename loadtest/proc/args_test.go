package proc

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestServeArgsRender(t *testing.T) {
	if got := (ServeArgs{}).Args(); !slices.Equal(got, []string{"serve"}) {
		t.Fatalf("zero value: %q", got)
	}
	a := ServeArgs{
		Listen: "127.0.0.1:1", Backends: []string{"http://a:1", "b=http://b:2;zone=z"}, LoadFactor: 1.25,
		ProbePath: "/health", NoProbes: true, NoEngineMetrics: true, AdminPublicMetrics: true,
		ShutdownTimeout: 2 * time.Second, Extra: []string{"--listen", "127.0.0.1:2"},
	}
	want := []string{"serve", "--listen", "127.0.0.1:1", "--backends", "http://a:1,b=http://b:2;zone=z", "--load-factor", "1.25",
		"--probe-path", "", "--engine-metrics-path", "", "--admin-public-metrics", "--shutdown-timeout", "2s", "--listen", "127.0.0.1:2"}
	if got := a.Args(); !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	g := GpusimArgs{Instances: 1, Listen: "127.0.0.1:0", TimeScale: 0.01, Extra: []string{"--itl-base", "20ms"}}
	if got := strings.Join(g.Args(), " "); got != "gpusim --instances 1 --listen 127.0.0.1:0 --time-scale 0.01 --itl-base 20ms" {
		t.Fatalf("gpusim: %q", got)
	}
}

func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{in: "", want: nil},
		{in: "  \t\n", want: nil},
		{in: "--time-scale 0.5", want: []string{"--time-scale", "0.5"}},
		{in: " --a=1   --b  2 ", want: []string{"--a=1", "--b", "2"}},
		{in: "--join a,b --kv-blocks=100", want: []string{"--join", "a,b", "--kv-blocks=100"}},
		{in: `--model 'llama 3' --x "a \"b\" \\ \c"`, want: []string{"--model", "llama 3", "--x", `a "b" \ \c`}},
		{in: `--probe-path ''`, want: []string{"--probe-path", ""}},
		{in: `a\ b c`, want: []string{"a b", "c"}},
		{in: `pre'mid dle'post`, want: []string{"premid dlepost"}},
		{in: "caf\u00e9\u00a0x", want: []string{"caf\u00e9", "x"}},
		{in: `'open`, err: true},
		{in: `"open`, err: true},
		{in: `"open\"`, err: true},
		{in: `trailing\`, err: true},
	} {
		got, err := SplitArgs(tc.in)
		if tc.err {
			if !errors.Is(err, ErrBadArgs) {
				t.Errorf("%q: %q %v, want ErrBadArgs", tc.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

// quote is a shell quoting of one word that SplitArgs reads back.
func quote(w string) string { return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'" }

// FuzzSplitArgs: SplitArgs never panics; without quotes or backslashes it
// is strings.Fields; every word it returns, quoted again, reads back the
// same; a value that fails is reported with ErrBadArgs.
func FuzzSplitArgs(f *testing.F) {
	for _, s := range []string{"--time-scale 0.5", `--model 'a b' --x "c \" d"`, `a\ b`, "'", `"\`, "x\u00a0y\u2028z", "\xff\xfe 'a'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := SplitArgs(s)
		if err != nil {
			if !errors.Is(err, ErrBadArgs) {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if !strings.ContainsAny(s, `'"\`) && !slices.Equal(words, strings.Fields(s)) {
			t.Fatalf("%q: %q, strings.Fields gives %q", s, words, strings.Fields(s))
		}
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, quote(w))
		}
		again, err := SplitArgs(strings.Join(quoted, " "))
		if err != nil || !slices.Equal(again, words) {
			t.Fatalf("%q: %q quoted reads back as %q (%v)", s, words, again, err)
		}
	})
}

func TestFreeAddrs(t *testing.T) {
	addrs, err := FreeAddrs("127.0.0.1", 5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if !strings.HasPrefix(a, "127.0.0.1:") || seen[a] {
			t.Fatalf("addresses %v", addrs)
		}
		seen[a] = true
	}
	if _, err := FreeAddrs("192.0.2.1", 1); err == nil {
		t.Fatal("an address not on this machine was found free")
	}
}
