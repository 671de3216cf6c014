package imgcache

import (
	"errors"
	"fmt"
	"path/filepath"

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

// isMountPoint reports whether dir is on another device than its parent.
func isMountPoint(dir string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &pst); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	return st.Dev != pst.Dev, nil
}

// unmountTmpfs unmounts the tmpfs on dir.
func unmountTmpfs(dir string) error {
	if err := unix.Unmount(dir, 0); err != nil {
		return fmt.Errorf("unmount tmpfs on %s: %w", dir, err)
	}
	return nil
}
