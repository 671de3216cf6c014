//go:build !linux

package imgcache

import "fmt"

func isTmpfs(dir string) (bool, error) {
	return false, fmt.Errorf("check %s for tmpfs: %w (Linux only: set NoMount)", dir, ErrUnavailable)
}

func mountTmpfs(dir string, _ int64) error {
	return fmt.Errorf("mount tmpfs on %s: %w (Linux only: set NoMount)", dir, ErrUnavailable)
}

func isMountPoint(string) (bool, error) { return false, nil }

func unmountTmpfs(dir string) error {
	return fmt.Errorf("unmount tmpfs on %s: %w (Linux only)", dir, ErrUnavailable)
}
