package inspector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxSymlinks bounds symlink resolution, as the kernel's ELOOP does.
const maxSymlinks = 40

// ResolveIn resolves the parent directories of sandbox path p inside root
// (symlinks are followed as the sandbox would, never out of root) and
// returns the host path of p's last component, not followed. missing says
// that a parent does not exist (then p does not either).
func ResolveIn(root, p string) (host string, missing bool, err error) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	cur := "/" // resolved sandbox path so far
	links := 0
	for len(parts) > 0 {
		c := parts[0]
		parts = parts[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		if len(parts) == 0 {
			return root + next, false, nil
		}
		fi, err := os.Lstat(root + next)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return "", true, nil
		}
		if err != nil {
			return "", false, err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if links++; links > maxSymlinks {
				return "", true, nil // ELOOP: nothing there
			}
			t, err := os.Readlink(root + next)
			if err != nil {
				return "", false, err
			}
			if strings.HasPrefix(t, "/") {
				cur = "/"
			}
			parts = append(strings.Split(t, "/"), parts...)
			continue
		}
		if !fi.IsDir() {
			return "", true, nil
		}
		cur = next
	}
	return root + cur, false, nil
}

// fileState is what a path looks like in one tree, as far as the net-change
// rules care: existence, type, mode, owner, size, symlink target, extended
// attributes and the modification time of what is not a directory (make
// and other build tools decide on it, and a snapshot brings the old one
// back). The content of a regular file is compared apart, only when all
// of these match (sameContent). The access and change times and inode
// numbers do not count (docs/inspector.md, "What a restore brings back").
type fileState struct {
	exists   bool
	mtime    unix.Timespec
	mode     uint32
	uid, gid uint32
	size     int64
	rdev     uint64
	target   string
	xattrs   string
	// nlink of what is not a directory: a name replaced by a copy
	// (`cp -p f1 t && mv t f1`) leaves its old hard links with one
	// name fewer, which a restore brings back.
	nlink      uint64
	resolvedTo string // the sandbox path the parents resolved to
}

// stateOf returns the state of sandbox path p in the tree at root and,
// for a regular file, where to read its content.
func stateOf(root, p string) (fileState, regular, error) {
	host, missing, err := ResolveIn(root, p)
	if err != nil || missing {
		return fileState{}, regular{}, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(host, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return fileState{}, regular{}, nil
		}
		return fileState{}, regular{}, fmt.Errorf("lstat %s: %w", host, err)
	}
	s := fileState{exists: true, mtime: st.Mtim, mode: st.Mode, uid: st.Uid, gid: st.Gid, resolvedTo: strings.TrimPrefix(host, root)}
	var r regular
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// A directory's mtime moves whenever an entry comes or goes, a
		// temporary file included: it is not compared (docs/inspector.md,
		// "What a restore brings back": a known gap).
		s.mtime = unix.Timespec{}
	case unix.S_IFSOCK:
		// A restore binds a socket anew (init's control socket too),
		// which gives its file a new mtime.
		s.mtime = unix.Timespec{}
	case unix.S_IFREG:
		s.size = st.Size
		s.nlink = uint64(st.Nlink)
		r = regular{host: host, dev: st.Dev, ino: st.Ino, blocks: st.Blocks}
	case unix.S_IFLNK:
		if s.target, err = os.Readlink(host); err != nil {
			return s, r, fmt.Errorf("readlink %s: %w", host, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		s.rdev = st.Rdev
		s.nlink = uint64(st.Nlink)
	case unix.S_IFIFO:
		s.nlink = uint64(st.Nlink)
	}
	s.xattrs = xattrsOf(host)
	return s, r, nil
}

// xattrsOf lists a path's extended attributes and values, sorted. A list
// or value that cannot be read shows as an error, never as "none": two
// trees whose attributes cannot be read compare equal only when the errors
// do.
func xattrsOf(p string) string {
	list, err := readSized(func(b []byte) (int, error) { return unix.Llistxattr(p, b) })
	if errors.Is(err, unix.ENOTSUP) {
		return ""
	}
	if err != nil {
		return "listxattr: " + err.Error()
	}
	if len(list) == 0 {
		return ""
	}
	names := strings.Split(strings.TrimRight(string(list), "\x00"), "\x00")
	slices.Sort(names)
	var b bytes.Buffer
	for _, name := range names {
		val, err := readSized(func(b []byte) (int, error) { return unix.Lgetxattr(p, name, b) })
		if err != nil {
			fmt.Fprintf(&b, "%s: %v;", name, err)
			continue
		}
		fmt.Fprintf(&b, "%s=%x;", name, val)
	}
	return b.String()
}

// readSized calls read with a buffer that fits what it returns: first 4
// KiB, then, on ERANGE, the size a nil buffer reports (a list or value
// can grow in between: it tries a few times).
func readSized(read func([]byte) (int, error)) ([]byte, error) {
	buf := make([]byte, 4096)
	for try := 0; ; try++ {
		n, err := read(buf)
		if err == nil {
			return buf[:n], nil
		}
		if !errors.Is(err, unix.ERANGE) || try == 3 {
			return nil, err
		}
		if n, err = read(nil); err != nil {
			return nil, err
		}
		buf = make([]byte, n+64)
	}
}

// PathChanged compares sandbox path p in the live tree and in the snapshot
// of the last filesystem artifact (both host paths of the trees' roots),
// reading at most DefaultMaxRead bytes of content (PathChangedWithin).
// It gives up with ErrStalled when ctx's deadline passes while the file
// system does not answer.
func PathChanged(ctx context.Context, liveRoot, snapRoot, p string) (bool, error) {
	return PathChangedWithin(ctx, NewBudget(DefaultMaxRead), liveRoot, snapRoot, p)
}

// PathChangedWithin is PathChanged charging the content it reads to bud,
// which the comparisons of a turn share: a regular file whose content bud
// cannot cover counts as changed. The comparison checks ctx between
// chunks and stops there; the call returns as soon as ctx ends
// (ErrStalled when its deadline passed), and only a system call blocked
// in the kernel (a file system that stopped answering) keeps the
// comparison's goroutine longer.
func PathChangedWithin(ctx context.Context, bud *Budget, liveRoot, snapRoot, p string) (bool, error) {
	return bounded(ctx, func() (bool, error) { return pathChanged(ctx, bud, liveRoot, snapRoot, p) })
}

func pathChanged(ctx context.Context, bud *Budget, liveRoot, snapRoot, p string) (bool, error) {
	a, ra, err := stateOf(liveRoot, p)
	if err != nil {
		return true, err
	}
	b, rb, err := stateOf(snapRoot, p)
	if err != nil {
		return true, err
	}
	if !a.exists && !b.exists {
		return false, nil
	}
	if a != b {
		return true, nil
	}
	if a.mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	same, err := sameContent(ctx, bud, ra, rb, a.size)
	if err != nil {
		return true, fmt.Errorf("compare %s: %w", p, err)
	}
	return !same, nil
}

// DirTimesDiffer reports whether sandbox path p is a directory in both
// trees whose modification times differ. PathChangedWithin leaves a
// directory's mtime out (an entry coming or going moves it); the
// Inspector asks this for the directories a turn set the times of
// (utimensat: `touch -d`), which a restore of the older snapshot would
// bring back wrong.
func DirTimesDiffer(liveRoot, snapRoot, p string) (bool, error) {
	var st [2]unix.Stat_t
	for i, root := range []string{liveRoot, snapRoot} {
		host, missing, err := ResolveIn(root, p)
		if err != nil {
			return true, err
		}
		if missing {
			return false, nil
		}
		if err := unix.Lstat(host, &st[i]); err != nil {
			return false, nil // gone: PathChangedWithin has said so
		}
		if st[i].Mode&unix.S_IFMT != unix.S_IFDIR {
			return false, nil
		}
	}
	return st[0].Mtim != st[1].Mtim, nil
}
