// Package criubin finds the CRIU binary Arbor drives: the one named by the
// --criu flag, else the private CRIU 4.x that scripts/deps.sh installs,
// else criu on PATH. Every package that runs CRIU resolves it here so they
// all agree with what `arbor doctor` reports.
package criubin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
)

// Private is where scripts/deps.sh installs its wrapper around Debian
// trixie's CRIU (see docs/install.md).
const Private = "/opt/arbor/criu/bin/criu"

// MinMajor is the oldest CRIU major version that works on current kernels
// (3.x fails on the vDSO of 6.x kernels such as this project's hosts).
const MinMajor = 4

// MinMinor is the oldest minor version of MinMajor that works: before 4.2
// CRIU cannot dump TCP sockets on kernels >= 6.16, which refuse
// SO_PASSCRED on them (checkpoint-restore/criu#2705).
const MinMinor = 2

// ErrNotFound means no CRIU binary was named, installed privately or on PATH.
var ErrNotFound = errors.New("criu not found")

// Path resolves the CRIU binary: flag if set, else Private if it exists,
// else criu on PATH.
func Path(flag string) (string, error) {
	return Resolve(flag, isExecutable, exec.LookPath)
}

// Resolve is Path with its file-system look-ups injected, for tests and
// for callers that probe another host view.
func Resolve(flag string, executable func(string) bool, lookPath func(string) (string, error)) (string, error) {
	if flag != "" {
		if !executable(flag) {
			return "", fmt.Errorf("resolve criu %s: %w", flag, ErrNotFound)
		}
		return flag, nil
	}
	if executable(Private) {
		return Private, nil
	}
	p, err := lookPath("criu")
	if err != nil {
		return "", fmt.Errorf("resolve criu (no %s, none on PATH): %w", Private, ErrNotFound)
	}
	return p, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

var versionRE = regexp.MustCompile(`(?m)^Version:\s*(\d+)\.(\d+)`)

// ParseVersion extracts major and minor from `criu --version` output
// ("Version: 4.1.1").
func ParseVersion(out string) (major, minor int, err error) {
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("parse criu version %q: no Version line", out)
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, nil
}
