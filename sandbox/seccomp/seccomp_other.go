//go:build !linux || !cgo

package seccomp

import (
	"fmt"
	"log/slog"
)

// Compile fails: this build has no libseccomp.
func Compile(caps []string, log *slog.Logger) (*Program, error) {
	return nil, fmt.Errorf("%w: arbor was built without cgo (libseccomp)", ErrUnsupported)
}

// LibraryVersion fails: this build has no libseccomp.
func LibraryVersion() (string, error) {
	return "", fmt.Errorf("%w: arbor was built without cgo (libseccomp)", ErrUnsupported)
}
