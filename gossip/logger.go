package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"net"
)

// logWriter turns memberlist's "[LEVEL] memberlist: text" lines into slog
// records. A failure to use this node's own socket after it was closed is
// part of stopping, not a problem: it goes to debug.
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
	if level > slog.LevelDebug && bytes.Contains(line, []byte(net.ErrClosed.Error())) {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if w.log.Enabled(ctx, level) {
		w.log.Log(ctx, level, string(bytes.TrimPrefix(line, []byte("memberlist: "))), "component", "memberlist")
	}
	return n, nil
}
