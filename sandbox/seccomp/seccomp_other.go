//go:build !linux || !cgo

package seccomp

import (
	"fmt"
	"log/slog"
)

// Program is a compiled filter (see the linux, cgo build).
type Program struct {
	BPF     []byte
	Skipped []string
}

// Instructions is the program's length in BPF instructions.
func (p *Program) Instructions() int { return len(p.BPF) / 8 }

// Compile fails: this build has no libseccomp.
func Compile(caps []string, log *slog.Logger) (*Program, error) {
	return nil, fmt.Errorf("%w: arbor was built without cgo (libseccomp)", ErrUnsupported)
}

// LibraryVersion fails: this build has no libseccomp.
func LibraryVersion() (string, error) {
	return "", fmt.Errorf("%w: arbor was built without cgo (libseccomp)", ErrUnsupported)
}
