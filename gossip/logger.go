package gossip

import (
	"bytes"
	"context"
	"log/slog"
)

// logWriter turns memberlist's "[LEVEL] memberlist: text" lines into slog
// records.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	n := len(p)
	line := bytes.TrimRight(p, "\r\n")
	level := slog.LevelInfo
	for _, l := range []struct {
		tag   string
		level slog.Level
	}{
		{"[DEBUG] ", slog.LevelDebug},
		{"[INFO] ", slog.LevelInfo},
		{"[WARN] ", slog.LevelWarn},
		{"[ERR] ", slog.LevelError},
		{"[ERROR] ", slog.LevelError},
	} {
		if i := bytes.Index(line, []byte(l.tag)); i >= 0 {
			level = l.level
			line = line[i+len(l.tag):]
			break
		}
	}
	ctx := context.Background()
	if w.log.Enabled(ctx, level) {
		w.log.Log(ctx, level, string(bytes.TrimPrefix(line, []byte("memberlist: "))), "component", "memberlist")
	}
	return n, nil
}
