package imgcache

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// errCrossDevice is rename's error when src and dst are on different file
// systems.
var errCrossDevice error = syscall.EXDEV

const (
	pendingPrefix = ".new-" // NewDir's directories until Commit
	tmpPrefix     = ".tmp-" // copies being written
	maxIDLen      = 200     // leaves room for the prefixes within NAME_MAX
)

// checkID rejects ids that are not a plain, visible path component.
func checkID(id string) error {
	switch {
	case id == "", len(id) > maxIDLen, strings.HasPrefix(id, "."),
		strings.ContainsAny(id, "/\\\x00"), id == "lost+found":
		return fmt.Errorf("check id %q: %w", id, ErrInvalidID)
	}
	return nil
}

// dirSize sums the sizes of the regular files under dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return n, nil
}

// copyTree copies the directory src into dst, which must exist and be
// empty. With durable it fsyncs every file and directory it writes, so a
// rename of dst afterwards publishes a complete copy even across a power
// loss.
func copyTree(src, dst string, durable bool) error {
	var dirs []string
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
					return err
				}
			}
			dirs = append(dirs, target)
		case d.Type().IsRegular():
			return copyFile(path, target, info.Mode().Perm(), durable)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		default:
			return fmt.Errorf("%s: unsupported file type %s", path, d.Type())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if durable {
		for _, d := range dirs {
			if err := syncDir(d); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode, durable bool) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	// *os.File's ReadFrom uses copy_file_range or sendfile where it can.
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if durable {
		return out.Sync()
	}
	return nil
}

// syncDir fsyncs a directory so the names created in it are durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// moveDir moves the directory src to dst, whose name must be free or hold a
// stale copy that may be discarded. A rename does it when both are on one
// file system; otherwise it copies into a temporary name beside dst, renames
// that into place and only then removes src, so a crash at any point leaves
// src intact or a complete dst (and at worst a .tmp- leftover that Open
// deletes). With durable the copy is fsynced before it is published.
// Without rename it always copies (tests use that to cover the copy path).
func moveDir(src, dst, id string, durable, rename bool) (err error) {
	parent := filepath.Dir(dst)
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("move %s: clear stale %s: %w", src, dst, err)
	}
	if !rename {
		err = errCrossDevice
	} else {
		err = os.Rename(src, dst)
	}
	if err == nil {
		if durable {
			return syncDir(parent)
		}
		return nil
	} else if !errors.Is(err, errCrossDevice) {
		return fmt.Errorf("move %s: %w", src, err)
	}
	if err := copyDir(src, dst, id, durable); err != nil {
		return err
	}
	if err := os.RemoveAll(src); err != nil {
		return fmt.Errorf("move %s: remove source: %w", src, err)
	}
	return nil
}

// copyDir copies src to dst through a temporary name beside dst.
func copyDir(src, dst, id string, durable bool) (err error) {
	parent := filepath.Dir(dst)
	tmp, err := os.MkdirTemp(parent, tmpPrefix+id+"-")
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp) // best effort: Open removes .tmp- leftovers too
		}
	}()
	if err := copyTree(src, tmp, durable); err != nil {
		return err
	}
	// MkdirTemp made tmp 0700; give the copy the source's mode.
	if info, err := os.Stat(src); err == nil {
		if err := os.Chmod(tmp, info.Mode().Perm()); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("copy %s: clear stale %s: %w", src, dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("copy %s: publish: %w", src, err)
	}
	if durable {
		return syncDir(parent)
	}
	return nil
}
