package ring

import (
	"reflect"
	"strings"
	"sync"
)

// SettingInfo describes one field of Settings, from its tags: what the
// flags, the YAML file and the admin API call it.
type SettingInfo struct {
	// Field is the Go field name.
	Field string
	// JSON is the admin API and Raft log name, YAML the config file's,
	// Flag the serve flag's, SageMaker the SageMaker alias ("" for none).
	JSON, YAML, Flag, SageMaker string
	// Help is the flag's help text (see settingHelp).
	Help string
	// Index is the field's index in Settings (reflect.Value.Field).
	Index int
}

var settingsInfo = sync.OnceValue(func() []SettingInfo {
	t := reflect.TypeOf(Settings{})
	out := make([]SettingInfo, t.NumField())
	for i := range out {
		f := t.Field(i)
		json, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out[i] = SettingInfo{Field: f.Name, JSON: json, YAML: f.Tag.Get("yaml"), Flag: f.Tag.Get("flag"),
			SageMaker: f.Tag.Get("sagemaker"), Help: settingHelp(f), Index: i}
	}
	return out
})

// settingHelp is field f's help text: its help tag, and for the strategy
// the strategies' names after it, from strategyTable (a tag could not
// keep up with them).
func settingHelp(f reflect.StructField) string {
	h := f.Tag.Get("help")
	if f.Type == reflect.TypeFor[Strategy]() {
		h += ": " + StrategyList()
	}
	return h
}

// SettingsInfo lists every routing setting, in field order.
func SettingsInfo() []SettingInfo { return settingsInfo() }

// LookupSetting finds a setting by its JSON name or its SageMaker alias.
func LookupSetting(name string) (SettingInfo, bool) {
	for _, s := range settingsInfo() {
		if name == s.JSON || (s.SageMaker != "" && name == s.SageMaker) {
			return s, true
		}
	}
	return SettingInfo{}, false
}

// Field returns a pointer to the field of s that info describes (*int,
// *float64, *bool or *Strategy), for binding it to a flag or a parser.
func (s *Settings) Field(info SettingInfo) any {
	return reflect.ValueOf(s).Elem().Field(info.Index).Addr().Interface()
}
