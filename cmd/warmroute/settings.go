package main

import (
	"encoding"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/warmroute/warmroute/node"
	"github.com/warmroute/warmroute/ring"
)

// A settings section is a block of node.Config declared as one tagged
// type: ring.Settings (routing), proxy.Limits, proxy.Upstream,
// proxy.Health and node.ClusterConfig. Each field's tags name it
// everywhere: yaml in the section's block of the config file, flag the
// serve flag and so its WARMROUTE_ variable, help the flag's help text,
// sagemaker a SageMaker alias flag, env (instead of flag) a secret only
// that variable carries. serve's flags, the variables it accepts, --help
// and the tables of docs/configuration.md come from these tags (and, for
// the routing section, ring.SettingsInfo's help, which lists the
// strategies), so a new setting is one field in one section.

// section is one settings section of a node.Config.
type section struct {
	// YAML is the section's block in the config file.
	YAML string
	// v is the section's struct, addressable.
	v reflect.Value
}

// setting is one field of a section, named by its tags.
type setting struct {
	// Field is the Go field name.
	Field string
	// YAML is the key within the section's block; Flag the serve flag
	// ("" for a secret); Env the variable of a secret ("" for the
	// others, whose variable comes from Flag); SageMaker the alias flag
	// ("" for none); Help the flag's help text.
	YAML, Flag, Env, SageMaker, Help string
	// Ptr points at the field: *string, *int, *float64, *bool,
	// *time.Duration, *[]string or a textSetting.
	Ptr any
}

// settingSections lists the sections of cfg: every struct field of
// node.Config whose own fields carry flag or env tags.
func settingSections(cfg *node.Config) []section {
	v := reflect.ValueOf(cfg).Elem()
	var out []section
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() != reflect.Struct || !tagged(f.Type) {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		out = append(out, section{YAML: name, v: v.Field(i)})
	}
	return out
}

// tagged reports whether a struct type has a field tagged flag or env.
func tagged(t reflect.Type) bool {
	for i := range t.NumField() {
		if tag := t.Field(i).Tag; tag.Get("flag") != "" || tag.Get("env") != "" {
			return true
		}
	}
	return false
}

// settings lists the section's fields that carry a flag or env tag, in
// field order.
func (s section) settings() []setting {
	var out []setting
	for i := range s.v.NumField() {
		f := s.v.Type().Field(i)
		st := setting{Field: f.Name, Flag: f.Tag.Get("flag"), Env: f.Tag.Get("env"),
			SageMaker: f.Tag.Get("sagemaker"), Help: f.Tag.Get("help"), Ptr: s.v.Field(i).Addr().Interface()}
		if s.v.Type() == reflect.TypeFor[ring.Settings]() {
			// ring completes its settings' help: the strategy's lists
			// the strategies of its table.
			st.Help = ring.SettingsInfo()[i].Help
		}
		st.YAML, _, _ = strings.Cut(f.Tag.Get("yaml"), ",")
		if st.Flag != "" || st.Env != "" {
			out = append(out, st)
		}
	}
	return out
}

// sectionFlags binds a flag to every setting of a section that has one,
// and one more under its SageMaker name where it has one.
func sectionFlags(fs *flag.FlagSet, s section) {
	for _, st := range s.settings() {
		if st.Flag == "" {
			continue
		}
		bindFlag(fs, st.Ptr, st.Flag, st.Help)
		if st.SageMaker != "" {
			bindFlag(fs, st.Ptr, st.SageMaker, "SageMaker name for --"+st.Flag)
		}
	}
}

// bindFlag binds the flag name to the setting p points at, with its
// current value as the default.
func bindFlag(fs *flag.FlagSet, p any, name, help string) {
	switch p := p.(type) {
	case *string:
		fs.StringVar(p, name, *p, help)
	case *int:
		fs.IntVar(p, name, *p, help)
	case *float64:
		fs.Float64Var(p, name, *p, help)
	case *bool:
		fs.BoolVar(p, name, *p, help)
	case *time.Duration:
		fs.DurationVar(p, name, *p, help)
	case *[]string:
		fs.Var(listFlag{p}, name, help)
	case textSetting:
		fs.TextVar(p, name, p, help)
	default:
		panic(fmt.Sprintf("setting --%s: no flag type for %T", name, p))
	}
}

// textSetting is a setting spelled as text: a name (ring.Strategy,
// KeyDepth, OverflowRule), a size (bytesize.Size), a port list.
type textSetting interface {
	encoding.TextMarshaler
	encoding.TextUnmarshaler
}

// secretEnv sets every secret of cfg's sections (an env tag) from its
// variable.
func secretEnv(cfg *node.Config) {
	for _, st := range secretSettings(cfg) {
		*st.Ptr.(*string) = os.Getenv(st.Env)
	}
}

// secretSettings lists the settings of cfg that only a variable carries.
func secretSettings(cfg *node.Config) []setting {
	var out []setting
	for _, s := range settingSections(cfg) {
		for _, st := range s.settings() {
			if st.Env != "" {
				out = append(out, st)
			}
		}
	}
	return out
}
