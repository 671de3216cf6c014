//go:build !linux

package image

import (
	"context"
	"errors"
	"io"
)

// runRecipeSteps needs chroot and mounts: recipes build on Linux only.
func (s *Store) runRecipeSteps(context.Context, string, *Recipe, Info, string, io.Writer) error {
	return errors.New("image recipes build on Linux only")
}
