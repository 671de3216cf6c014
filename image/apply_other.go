//go:build !linux

package image

import (
	"context"
	"errors"
	"io"
)

// applyLayer needs Linux (openat2's RESOLVE_IN_ROOT): apply_linux.go.
func applyLayer(context.Context, string, io.Reader) (int64, error) {
	return 0, errors.New("applying image layers needs Linux")
}

// ApplyTar needs Linux: apply_linux.go.
func ApplyTar(ctx context.Context, root string, r io.Reader) (int64, error) {
	return applyLayer(ctx, root, r)
}
