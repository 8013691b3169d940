package cluster

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends Raft's and raft-wal's hclog output to slog. Raft
// reports routine events (state changes, elections) at info; they go to
// debug so a node stays quiet at info. Warnings and errors keep their
// level.
type hclogAdapter struct {
	log  *slog.Logger
	name string
	args []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHclog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{log: l, name: name}
}

func (h *hclogAdapter) level(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace, hclog.Debug, hclog.Info, hclog.NoLevel:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (h *hclogAdapter) Log(l hclog.Level, msg string, args ...any) {
	if l == hclog.Off {
		return
	}
	lv := h.level(l)
	ctx := context.Background()
	if !h.log.Enabled(ctx, lv) {
		return
	}
	all := make([]any, 0, len(h.args)+len(args)+2)
	all = append(all, "component", h.name)
	all = append(all, h.args...)
	all = append(all, args...)
	h.log.Log(ctx, lv, msg, all...)
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) enabled(l hclog.Level) bool {
	return h.log.Enabled(context.Background(), h.level(l))
}

func (h *hclogAdapter) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hclogAdapter) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hclogAdapter) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hclogAdapter) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hclogAdapter) IsError() bool { return h.enabled(hclog.Error) }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any(nil), h.args...), args...)
	return &c
}

func (h *hclogAdapter) Name() string { return h.name }

func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

// SetLevel is ignored: the slog handler decides.
func (h *hclogAdapter) SetLevel(hclog.Level) {}

func (h *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case h.IsDebug():
		return hclog.Debug
	case h.IsWarn():
		return hclog.Warn
	}
	return hclog.Error
}

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{h}
}

// stdWriter turns "[LEVEL] text" lines from a standard logger into records.
type stdWriter struct{ h *hclogAdapter }

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\r\n")
	l := hclog.Info
	for tag, lv := range map[string]hclog.Level{"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug, "[INFO]": hclog.Info, "[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error} {
		if i := strings.Index(line, tag); i >= 0 {
			l, line = lv, strings.TrimSpace(line[i+len(tag):])
			break
		}
	}
	w.h.Log(l, line)
	return len(p), nil
}
