package main

import (
	"context"
	"errors"
	"io"
)

// TODO: placeholder until the loadtest subcommand is built.
func cmdLoadtest(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("loadtest: not built yet")
}
