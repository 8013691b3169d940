package main

import (
	"context"
	"errors"
	"io"
)

// TODO: placeholder until the demo subcommand is built.
func cmdDemo(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("demo: not built yet")
}
