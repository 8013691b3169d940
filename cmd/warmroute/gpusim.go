package main

import (
	"context"
	"errors"
	"io"
)

// TODO: placeholder until the gpusim subcommand is built.
func cmdGpusim(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("gpusim: not built yet")
}
