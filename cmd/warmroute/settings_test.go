package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/bytesize"
	"github.com/warmroute/warmroute/node"
	"github.com/warmroute/warmroute/ring"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite the generated settings tables of docs/configuration.md")

// configDoc is the settings reference, relative to this package.
const configDoc = "../../docs/configuration.md"

// boundFlags returns serve's flag set bound to a fresh default config.
func boundFlags(t *testing.T) (*flag.FlagSet, *node.Config) {
	t.Helper()
	cfg := node.DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	serveFlags(fs, &cfg)
	return fs, &cfg
}

// sampleText returns a value for the flag that differs from its default,
// as a flag (or variable) takes it and as a YAML scalar or list writes it.
func sampleText(t *testing.T, f *flag.Flag) (text, yamlText string) {
	t.Helper()
	switch v := f.Value.(type) {
	case listFlag:
		return "a.example,b.example", "[a.example, b.example]"
	case backendsFlag:
		return "http://10.0.0.1:8000", "[http://10.0.0.1:8000]"
	case flag.Getter:
		switch d := v.Get().(type) {
		case string:
			return "sample-" + d, "sample-" + d
		case int:
			return strconv.Itoa(d + 3), strconv.Itoa(d + 3)
		case float64:
			s := strconv.FormatFloat(d+1.5, 'g', -1, 64)
			return s, s
		case bool:
			return strconv.FormatBool(!d), strconv.FormatBool(!d)
		case time.Duration:
			return (d + 1500*time.Millisecond).String(), (d + 1500*time.Millisecond).String()
		case *bytesize.Size:
			s := (*d + 3<<20).String()
			return s, s
		case *node.PortList:
			return "8000,8001", "8000,8001"
		case *ring.Strategy:
			return "CONSISTENT_HASH", "CONSISTENT_HASH"
		case *ring.KeyDepth:
			return "FIXED", "FIXED"
		case *ring.OverflowRule:
			return "THRESHOLD", "THRESHOLD"
		case *ring.HeaderName:
			return "X-Sample-Session", "X-Sample-Session"
		}
	}
	t.Fatalf("--%s: no sample value for %T: add one to sampleText", f.Name, f.Value)
	return "", ""
}

// yamlDoc writes a config file setting the dotted key to the YAML text.
func yamlDoc(key, text string) string {
	parts := strings.Split(key, ".")
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i == len(parts)-1 {
			b.WriteString(" " + text)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// checkReachesYAML fails unless the YAML key sets what the flag sets:
// the flag given the sample, and the file given the same sample, leave
// the same value.
func checkReachesYAML(t *testing.T, flagName, key string) {
	t.Helper()
	fs, _ := boundFlags(t)
	f := fs.Lookup(flagName)
	if f == nil {
		t.Errorf("no flag --%s", flagName)
		return
	}
	text, yamlText := sampleText(t, f)
	if err := f.Value.Set(text); err != nil {
		t.Errorf("--%s=%s: %v", flagName, text, err)
		return
	}
	if f.Value.String() == f.DefValue {
		t.Errorf("--%s: the sample %q is the default: the test cannot tell where it lands", flagName, text)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(yamlDoc(key, yamlText)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := node.DefaultConfig()
	if err := cfg.LoadFile(path); err != nil {
		t.Errorf("--%s: YAML key %s: %v", flagName, key, err)
		return
	}
	fs2 := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveFlags(fs2, &cfg)
	if got, want := fs2.Lookup(flagName).Value.String(), f.Value.String(); got != want {
		t.Errorf("YAML %s: %s sets --%s to %q; the flag given the same sets %q", key, yamlText, flagName, got, want)
	}
}

// TestSettingsReachFlagsYAMLAndEnv: every field of every settings section
// reaches a flag (with its SageMaker alias), a WARMROUTE_ variable and a
// YAML key, and those set the same field; a secret reaches only its
// variable. Names are unique and every setting has help.
func TestSettingsReachFlagsYAMLAndEnv(t *testing.T) {
	fs, cfg := boundFlags(t)
	envs := serveEnvNames(fs)
	secs := settingSections(cfg)
	var names []string
	for _, s := range secs {
		names = append(names, s.YAML)
	}
	for _, want := range []string{"routing", "limits", "upstream", "health", "cluster"} {
		if !slices.Contains(names, want) {
			t.Fatalf("sections %v lack %s", names, want)
		}
	}
	seen := map[string]string{}
	unique := func(kind, name, where string) {
		if prev, ok := seen[kind+name]; ok {
			t.Errorf("%s %s used by %s and %s", kind, name, prev, where)
		}
		seen[kind+name] = where
	}
	n := 0
	for _, s := range secs {
		sts := s.settings()
		if len(sts) != s.v.NumField() {
			t.Errorf("section %s: %d of its %d fields have a flag or env tag", s.YAML, len(sts), s.v.NumField())
		}
		for _, st := range sts {
			n++
			where := s.YAML + "." + st.Field
			if st.Help == "" {
				t.Errorf("%s has no help tag", where)
			}
			if st.Env != "" {
				// A secret: its variable only.
				if st.Flag != "" || st.YAML != "-" {
					t.Errorf("%s: a secret (env %s) must have no flag and yaml:\"-\"", where, st.Env)
				}
				unique("env ", st.Env, where)
				if !slices.Contains(envs, st.Env) {
					t.Errorf("%s: %s is not among the variables serve accepts", where, st.Env)
				}
				t.Setenv(st.Env, "s3cret-"+st.Field)
				c := node.DefaultConfig()
				secretEnv(&c)
				for _, cs := range settingSections(&c) {
					for _, cst := range cs.settings() {
						if cst.Env == st.Env && *cst.Ptr.(*string) != "s3cret-"+st.Field {
							t.Errorf("%s: %s did not reach the field", where, st.Env)
						}
					}
				}
				continue
			}
			if st.YAML == "" || st.YAML == "-" {
				t.Errorf("%s has a flag but no YAML key", where)
			}
			unique("flag ", st.Flag, where)
			unique("yaml ", s.YAML+"."+st.YAML, where)
			f := fs.Lookup(st.Flag)
			if f == nil {
				t.Errorf("%s: no flag --%s", where, st.Flag)
				continue
			}
			// The flag is bound to this field.
			text, _ := sampleText(t, f)
			before := reflect.ValueOf(st.Ptr).Elem().Interface()
			if err := fs.Set(st.Flag, text); err != nil {
				t.Errorf("--%s=%s: %v", st.Flag, text, err)
			} else if reflect.DeepEqual(reflect.ValueOf(st.Ptr).Elem().Interface(), before) {
				t.Errorf("--%s=%s left %s at %v", st.Flag, text, where, before)
			}
			if st.SageMaker != "" {
				unique("flag ", st.SageMaker, where)
				if fs.Lookup(st.SageMaker) == nil {
					t.Errorf("%s: no alias flag --%s", where, st.SageMaker)
				}
			}
			if !slices.Contains(envs, envName(st.Flag)) {
				t.Errorf("%s: %s is not among the variables serve accepts", where, envName(st.Flag))
			}
			checkReachesYAML(t, st.Flag, s.YAML+"."+st.YAML)
		}
	}
	if n < 60 {
		t.Fatalf("only %d settings found in %v", n, names)
	}
}

// TestSecretsFromTheirVariables: serve reads each secret from its variable,
// and the variable serve accepts is the one the tag names.
func TestSecretsFromTheirVariables(t *testing.T) {
	t.Setenv("WARMROUTE_GOSSIP_KEY", "a2V5")
	t.Setenv("WARMROUTE_ADMIN_TOKEN", "tok")
	cfg := node.DefaultConfig()
	secretEnv(&cfg)
	if cfg.Cluster.GossipKey != "a2V5" || cfg.Admin.Token != "tok" {
		t.Fatalf("gossip key %q, admin token %q", cfg.Cluster.GossipKey, cfg.Admin.Token)
	}
}

// generated matches a generated block of the settings reference.
var generated = regexp.MustCompile(`(?s)<!-- generated: ([a-z_]+) -->\n(.*?)<!-- end generated -->`)

// settingsTable renders a section as the reference's table: flag (with its
// SageMaker alias), variable, YAML key, default (as --help shows it),
// meaning.
func settingsTable(t *testing.T, fs *flag.FlagSet, s section) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("| flag | variable | YAML key | default | meaning |\n|---|---|---|---|---|\n")
	cell := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + s + "`"
	}
	for _, st := range s.settings() {
		var flagCell, env, key, def string
		if st.Env != "" {
			flagCell, env, key = "(none: a secret)", cell(st.Env), "(none)"
		} else {
			flagCell, env, key = cell("--"+st.Flag), cell(envName(st.Flag)), cell(s.YAML+"."+st.YAML)
			if st.SageMaker != "" {
				flagCell += " (" + cell("--"+st.SageMaker) + ")"
			}
			f := fs.Lookup(st.Flag)
			if f == nil {
				t.Fatalf("no flag --%s", st.Flag)
			}
			def = cell(f.DefValue)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", flagCell, env, key, def, strings.ReplaceAll(st.Help, "|", `\|`))
	}
	return b.String()
}

// TestSettingsDocs: the tables of docs/configuration.md are generated
// from the settings sections (rewritten with -update-golden); every serve
// flag is in that page; and the hand-written tables that name settings
// (the rest of that page, the README's, hardening.md's limits) name real
// flags with their YAML keys and defaults.
func TestSettingsDocs(t *testing.T) {
	t.Parallel()
	fs, cfg := boundFlags(t)
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, s := range settingSections(cfg) {
		want[s.YAML] = settingsTable(t, fs, s)
	}
	found := map[string]bool{}
	out := generated.ReplaceAllStringFunc(string(doc), func(m string) string {
		sub := generated.FindStringSubmatch(m)
		name, body := sub[1], sub[2]
		found[name] = true
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: a generated block for %q, which is no settings section", configDoc, name)
			return m
		}
		if body != w && !*updateGolden {
			t.Errorf("%s: the %s table differs from its type; run go test ./cmd/warmroute -run TestSettingsDocs -update-golden\nwant:\n%s\ngot:\n%s", configDoc, name, w, body)
		}
		return "<!-- generated: " + name + " -->\n" + w + "<!-- end generated -->"
	})
	for name := range want {
		if !found[name] {
			t.Errorf("%s has no generated block for the %s section: add <!-- generated: %s --> and <!-- end generated -->", configDoc, name, name)
		}
	}
	if *updateGolden && out != string(doc) {
		if err := os.WriteFile(configDoc, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out, "`--"+f.Name+"`") {
			t.Errorf("%s does not list --%s", configDoc, f.Name)
		}
	})

	hand := generated.ReplaceAllString(out, "")
	checkTable(t, fs, configDoc, hand, "| flag | YAML key | default | meaning |")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	checkTable(t, fs, "README.md", string(readme), "| flag | default | meaning |")
	hardening, err := os.ReadFile("../../docs/hardening.md")
	if err != nil {
		t.Fatal(err)
	}
	checkTable(t, fs, "docs/hardening.md", string(hardening), "| setting (flag; YAML `limits:`/`upstream:`) | default | when exceeded | test |")
}

var (
	flagsInCell  = regexp.MustCompile("`--([A-Za-z0-9-]+)`")
	valuesInCell = regexp.MustCompile("`([^`]*)`")
	keysInCell   = regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+)?)`")
)

// checkTable checks the rows of the table under header in a doc whose
// first cell starts with a flag: the flags exist; the YAML keys the row
// gives (a column "YAML key", or in parentheses in the first cell) set
// what the flag sets; the default column's values, in code font, are the
// flags' defaults (one value for all, one each, or none for an empty
// default).
func checkTable(t *testing.T, fs *flag.FlagSet, name, doc, header string) {
	t.Helper()
	i := strings.Index(doc, header+"\n")
	if i < 0 {
		t.Errorf("%s: no table %q", name, header)
		return
	}
	cols := splitRow(header)
	keyCol, defCol := slices.Index(cols, "YAML key"), slices.Index(cols, "default")
	rows := 0
	for _, line := range strings.Split(doc[i+len(header)+1:], "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := splitRow(line)
		if len(cells) != len(cols) {
			t.Errorf("%s: row %q has %d cells, want %d", name, line, len(cells), len(cols))
			continue
		}
		if !strings.HasPrefix(cells[0], "`--") {
			continue // a row about a bound that is not a setting
		}
		rows++
		var flags []string
		for _, m := range flagsInCell.FindAllStringSubmatch(cells[0], -1) {
			flags = append(flags, m[1])
		}
		var keys []string
		if keyCol >= 0 {
			for _, m := range keysInCell.FindAllStringSubmatch(cells[keyCol], -1) {
				keys = append(keys, m[1])
			}
		} else if _, rest, ok := strings.Cut(cells[0], "("); ok {
			for _, m := range keysInCell.FindAllStringSubmatch(rest, -1) {
				keys = append(keys, m[1])
			}
		}
		for _, f := range flags {
			if fs.Lookup(f) == nil {
				t.Errorf("%s: row %q names --%s, which serve does not take", name, cells[0], f)
			}
		}
		if len(keys) > 0 {
			// A SageMaker alias shares its setting's key, and a short key
			// (max_body_size) names the key within its section.
			real := slices.DeleteFunc(slices.Clone(flags), sageMakerAlias)
			if len(keys) != len(real) {
				t.Errorf("%s: row %q gives %d YAML keys for %d flags", name, cells[0], len(keys), len(real))
			} else {
				for j, f := range real {
					checkRowKey(t, name, f, keys[j])
				}
			}
		}
		var vals []string
		for _, m := range valuesInCell.FindAllStringSubmatch(cells[defCol], -1) {
			vals = append(vals, m[1])
		}
		for j, f := range flags {
			fl := fs.Lookup(f)
			if fl == nil {
				continue
			}
			var v string
			switch len(vals) {
			case 0:
				if fl.DefValue != "" && fl.DefValue != "false" {
					t.Errorf("%s: --%s's default is %q, the table gives none", name, f, fl.DefValue)
				}
				continue
			case 1:
				v = vals[0]
			default:
				if len(vals) != len(flags) {
					t.Errorf("%s: row %q: %d defaults for %d flags", name, cells[0], len(vals), len(flags))
					continue
				}
				v = vals[j]
			}
			if got := defaultAs(t, f, v); got != fl.DefValue {
				t.Errorf("%s: --%s's default is %q, the table says %q (%q)", name, f, fl.DefValue, v, got)
			}
		}
	}
	if rows == 0 {
		t.Errorf("%s: the table %q has no setting rows", name, header)
	}
}

// checkRowKey checks a YAML key a doc gives for a flag: it must set what
// the flag sets. A section's setting may be written short (max_hops for
// upstream.max_hops); any other key is written whole.
func checkRowKey(t *testing.T, name, flagName, key string) {
	t.Helper()
	_, cfg := boundFlags(t)
	for _, s := range settingSections(cfg) {
		for _, st := range s.settings() {
			if st.Flag != flagName {
				continue
			}
			if key != st.YAML && key != s.YAML+"."+st.YAML {
				t.Errorf("%s: --%s's YAML key is %s.%s, the doc says %s", name, flagName, s.YAML, st.YAML, key)
			}
			key = s.YAML + "." + st.YAML
		}
	}
	checkReachesYAML(t, flagName, key)
}

// defaultAs returns the text a flag shows for v ("5m" as "5m0s",
// "32 MiB" as "32MiB"), by setting it on a flag of a fresh flag set.
func defaultAs(t *testing.T, flagName, v string) string {
	t.Helper()
	fs, _ := boundFlags(t)
	f := fs.Lookup(flagName)
	if err := f.Value.Set(v); err != nil {
		return "unparsable: " + err.Error()
	}
	return f.Value.String()
}

// splitRow splits a Markdown table row into its trimmed cells.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}
