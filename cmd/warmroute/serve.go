package main

import (
	"context"
	"errors"
	"io"
)

// TODO: placeholder until the serve subcommand is built.
func cmdServe(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("serve: not built yet")
}
