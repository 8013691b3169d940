package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/node"
)

// TestServeObserveSettings: the access log, tracing and recording
// settings reach node.Config from flags, WARMROUTE_* variables and the
// YAML file, and bad values stop the router with a message naming them.
func TestServeObserveSettings(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	os.WriteFile(file, []byte(`access_log:
  mode: "0.25"
  format: text
  output: stderr
tracing:
  endpoint: http://collector:4318
  sample_ratio: 0.5
record:
  path: /tmp/rec.jsonl
  max_size: 64MiB
  max_records: 1000
`), 0o600)
	cfg, err := loadServeConfig([]string{"--config", file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := node.DefaultConfig()
	want.AccessLog = node.AccessLog{Mode: "0.25", Format: "text", Output: "stderr"}
	want.Tracing = node.Tracing{Endpoint: "http://collector:4318", SampleRatio: 0.5}
	want.Record = node.Record{Path: "/tmp/rec.jsonl", MaxSize: 64 << 20, MaxRecords: 1000}
	if cfg.AccessLog != want.AccessLog || cfg.Tracing != want.Tracing || cfg.Record != want.Record {
		t.Errorf("from YAML: %+v %+v %+v", cfg.AccessLog, cfg.Tracing, cfg.Record)
	}
	if rc := cfg.RequestLogConfig(); rc.AccessSample != 0.25 || rc.RecordMaxBytes != 64<<20 {
		t.Errorf("reqlog config %+v", rc)
	}

	t.Setenv("WARMROUTE_ACCESS_LOG", "on")
	t.Setenv("WARMROUTE_RECORD_TRACE", filepath.Join(dir, "r.jsonl"))
	cfg, err = loadServeConfig([]string{"--tracing-sample-ratio", "0.1", "--access-log-format", "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AccessLog.Mode != "on" || cfg.AccessLog.Format != "json" || cfg.Tracing.SampleRatio != 0.1 || cfg.Record.Path != filepath.Join(dir, "r.jsonl") {
		t.Errorf("from flags and variables: %+v %+v %+v", cfg.AccessLog, cfg.Tracing, cfg.Record)
	}
	os.Unsetenv("WARMROUTE_ACCESS_LOG")
	os.Unsetenv("WARMROUTE_RECORD_TRACE")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--access-log", "sometimes"}, `access log "sometimes": want off, on or a sampling rate`},
		{[]string{"--access-log", "1.5"}, "access log"},
		{[]string{"--access-log", "on", "--access-log-format", "xml"}, `access log format "xml"`},
		{[]string{"--access-log", "on", "--access-log-output", ""}, "access log output is empty"},
		{[]string{"--tracing-endpoint", "collector:4318"}, `tracing endpoint "collector:4318": want an http:// or https:// URL`},
		{[]string{"--tracing-sample-ratio", "2"}, "tracing sample ratio 2 outside [0, 1]"},
		{[]string{"--record-trace", "x.jsonl", "--record-trace-max-records", "0"}, "record max records 0 outside"},
		{[]string{"--record-trace", "x.jsonl", "--record-trace-max-size", "1KiB"}, "record max size"},
		{[]string{"--access-log", "on", "--access-log-output", "x.jsonl", "--record-trace", "x.jsonl"}, "both write x.jsonl"},
	} {
		_, err := loadServeConfig(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want it to mention %q", c.args, err, c.want)
		}
	}
}
