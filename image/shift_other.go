//go:build !linux

package image

import "errors"

// Shift is Linux-only (user namespace mode).
func Shift(root string, base, size uint32) error {
	return errors.New("image shift: user namespace mode is Linux-only")
}
