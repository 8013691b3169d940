package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// usageError is a mistake in the command line (a flag, an argument, a
// value of the wrong type): nothing was sent anywhere, and the command
// exits with status 2 rather than 1.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usageErrorf returns a usageError.
func usageErrorf(format string, a ...any) error {
	return usageError{fmt.Errorf(format, a...)}
}

// asUsage marks err, a flag parsing error, as a usage error (flag.ErrHelp
// and nil pass through).
func asUsage(err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	var u usageError
	if errors.As(err, &u) {
		return err
	}
	return usageError{err}
}

// exitCode maps a command's error to the process's exit status: 0 for
// none or --help, 2 for a usage error, 1 for anything else (a server that
// refused or could not be reached, a failed run).
func exitCode(err error) int {
	var u usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &u):
		return 2
	default:
		return 1
	}
}

// durationHint is what help texts and errors say about durations.
const durationHint = "use a unit, e.g. 500ms or 2s"

// durationValue is a duration flag whose errors say what a duration looks
// like: a bare number ("500") is refused with the unit hint.
type durationValue struct{ inner flag.Value }

func (d *durationValue) String() string {
	if d == nil || d.inner == nil {
		return time.Duration(0).String()
	}
	return d.inner.String()
}

func (d *durationValue) Set(s string) error {
	if _, err := time.ParseDuration(s); err != nil {
		if isNumber(s) {
			return fmt.Errorf("%q has no unit: %s", s, durationHint)
		}
		return fmt.Errorf("%q is not a duration: %s", s, durationHint)
	}
	return d.inner.Set(s)
}

// Get returns the duration, as the flag package's own duration flags do.
func (d *durationValue) Get() any {
	if g, ok := d.inner.(flag.Getter); ok {
		return g.Get()
	}
	return nil
}

func isNumber(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	dot := false
	for _, r := range s {
		switch {
		case r >= '0' && r <= '9':
		case r == '.' && !dot:
			dot = true
		default:
			return false
		}
	}
	return s != "."
}

// hintDurations makes every duration flag of fs explain itself: its help
// text names the type and an example, and a value without a unit is
// refused with the same hint.
func hintDurations(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		if _, ok := g.Get().(time.Duration); !ok {
			return
		}
		f.Value = &durationValue{inner: f.Value}
		if !strings.Contains(f.Usage, "`") {
			f.Usage += " (a `duration` with a unit: 500ms, 2s, 5m)"
		}
	})
}

// parseArgs parses args with flags allowed after positional arguments
// ('backends add URL --zone a') and returns the positional ones. Errors
// are usage errors, an unknown flag's with the closest known one.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	pos, err := parseFlags(fs, args)
	return pos, flagError(fs, err)
}

// flagError turns a flag parsing error into a usage error, naming the
// closest known flag when the flag is unknown.
func flagError(fs *flag.FlagSet, err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	const unknown = "flag provided but not defined: "
	if msg := err.Error(); strings.HasPrefix(msg, unknown) {
		name := strings.TrimLeft(strings.TrimPrefix(msg, unknown), "-")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if c := closest(name, names); c != "" {
			return usageErrorf("%w (did you mean --%s?)", err, c)
		}
	}
	return asUsage(err)
}

// closest returns the candidate nearest to s by edit distance, when it is
// near enough to be a likely typo, else "".
func closest(s string, candidates []string) string {
	best, bestD := "", -1
	ls := strings.ToLower(s)
	for _, c := range candidates {
		d := editDistance(ls, strings.ToLower(c))
		if bestD < 0 || d < bestD || (d == bestD && c < best) {
			best, bestD = c, d
		}
	}
	if bestD < 0 || bestD > max(2, len(s)/3) {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// otherEnvNames are the WARMROUTE_* variables that are neither serve
// flags nor the secrets of serve's settings (settings.go): the admin
// commands' defaults, and what the build, the tests and the deployment
// files read.
var otherEnvNames = []string{
	"WARMROUTE_ADMIN_URL", "WARMROUTE_ADMIN_CA_FILE",
	"WARMROUTE_IMAGE", "WARMROUTE_BIN", "WARMROUTE_E2E_BIN", "WARMROUTE_SKIP_E2E",
	"WARMROUTE_TEST_LOG", "WARMROUTE_SOAK_DURATION", "WARMROUTE_COMMIT_LATENCY",
	"WARMROUTE_RAFT_DEFAULT_TIMEOUTS",
}

// unknownEnv returns an error naming every WARMROUTE_* variable in environ
// that is not in known, each with the closest known name, as an unknown
// flag is reported: a misspelt variable would otherwise be ignored.
func unknownEnv(environ, known []string) error {
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "WARMROUTE_") || slices.Contains(known, name) {
			continue
		}
		if c := closest(name, known); c != "" {
			errs = append(errs, fmt.Errorf("environment variable %s is not a setting (did you mean %s?)", name, c))
		} else {
			errs = append(errs, fmt.Errorf("environment variable %s is not a setting (each flag --x-y is WARMROUTE_X_Y; see 'warmroute serve --help')", name))
		}
	}
	if errs == nil {
		return nil
	}
	return usageError{errors.Join(errs...)}
}

// cmdVersion prints the version and what the binary was built from.
func cmdVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return usageErrorf("version takes no arguments")
	}
	_, err := io.WriteString(stdout, versionText())
	return err
}

// versionText is the version line and the build information Go records:
// the toolchain, and the commit, its time and whether the tree had
// uncommitted changes, when built from a checkout.
func versionText() string {
	var b strings.Builder
	fmt.Fprintln(&b, "warmroute", version)
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b.String()
	}
	fmt.Fprintf(&b, "  go:        %s\n", bi.GoVersion)
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := cmp.Or(settings["vcs.revision"], commit); rev != "" {
		if settings["vcs.modified"] == "true" {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "  revision:  %s\n", rev)
	}
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(&b, "  time:      %s\n", t)
	}
	if p := settings["GOOS"] + "/" + settings["GOARCH"]; p != "/" {
		fmt.Fprintf(&b, "  platform:  %s\n", p)
	}
	return b.String()
}

// environ is os.Environ, a variable for tests.
var environ = os.Environ
