//go:build !linux

package image

import (
	"context"
	"errors"
	"io"
)

// ApplyTar needs Linux (openat2's RESOLVE_IN_ROOT): apply_linux.go.
func ApplyTar(context.Context, string, io.Reader) (int64, error) {
	return 0, errors.New("applying image layers needs Linux")
}
