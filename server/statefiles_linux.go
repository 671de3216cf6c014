package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// stateTree reads the files of a state (its read-only snapshot on the
// host, Coordinator.StateFiles) for the web view's diff. The snapshot's
// symbolic links are the sandbox's: a path is resolved inside the tree
// (openat2 RESOLVE_IN_ROOT, so ".." stops at its root) and no symbolic
// link is followed on the way (RESOLVE_NO_SYMLINKS: a path through one
// is refused) nor at its end (a link is reported with its target, as
// text). Nothing but a regular file is opened for reading, so a device
// node the sandbox made is never opened on the host.
type stateTree struct{ fd int }

// entry is what a path is in a state.
type entry struct {
	Exists bool
	Type   string // "file", "dir", "symlink", "other"
	Size   int64
	Link   string // a symlink's target
	// Through: a symbolic link is on the way to the path (or it leaves
	// the tree), so it was not read.
	Through bool
}

func openStateTree(dir string) (*stateTree, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open state files %s: %w", dir, err)
	}
	return &stateTree{fd: fd}, nil
}

func (t *stateTree) Close() { unix.Close(t.fd) }

// resolve is how every path is looked up.
const resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

func (t *stateTree) open(p string, flags uint64) (int, error) {
	rel := strings.TrimLeft(p, "/")
	if rel == "" {
		rel = "."
	}
	return unix.Openat2(t.fd, rel, &unix.OpenHow{Flags: flags | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve})
}

// stat describes path p (slash-separated, from the state's root).
func (t *stateTree) stat(p string) (entry, error) {
	fd, err := t.open(p, unix.O_PATH)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return entry{}, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return entry{Exists: true, Type: "other", Through: true}, nil
	case err != nil:
		return entry{}, fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return entry{}, fmt.Errorf("stat %s: %w", p, err)
	}
	e := entry{Exists: true, Size: st.Size}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = "file"
	case unix.S_IFDIR:
		e.Type, e.Size = "dir", 0
	case unix.S_IFLNK:
		e.Type = "symlink"
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return entry{}, fmt.Errorf("read link %s: %w", p, err)
		}
		e.Link = string(buf[:n])
	default:
		e.Type, e.Size = "other", 0
	}
	return e, nil
}

// read returns the content of regular file p, or too large when it has
// more than limit bytes.
func (t *stateTree) read(p string, limit int64) (b []byte, tooLarge bool, err error) {
	// Looked at before it is opened for reading: a device node or a fifo
	// is never opened.
	if e, err := t.stat(p); err != nil {
		return nil, false, err
	} else if e.Type != "file" || e.Through {
		return nil, false, fmt.Errorf("read %s: not a regular file", p)
	}
	fd, err := t.open(p, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		return nil, false, fmt.Errorf("open %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, fmt.Errorf("stat %s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, false, fmt.Errorf("read %s: not a regular file", p)
	}
	b, err = io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(b)) > limit {
		return nil, true, nil
	}
	return b, false, nil
}
