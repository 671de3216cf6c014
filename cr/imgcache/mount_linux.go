package imgcache

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// isTmpfs reports whether dir is on a tmpfs.
func isTmpfs(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Type == unix.TMPFS_MAGIC, nil
}

// mountTmpfs mounts a tmpfs of size bytes on dir. The size leaves room for
// images committed or loaded before eviction brings HotDir back within
// bounds, and for pinned ones.
func mountTmpfs(dir string, size int64) error {
	opts := fmt.Sprintf("size=%d,mode=0700", size)
	err := unix.Mount("arbor-images", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts)
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("mount tmpfs on %s: %w (%w: run as root or set NoMount)", dir, err, ErrUnavailable)
	case err != nil:
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}
