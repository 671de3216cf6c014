package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/arbor-env/arbor/cr"
	"golang.org/x/sys/unix"
)

// node is what Compare looks at for one path.
type node struct {
	st     unix.Stat_t
	link   string
	xattrs map[string][]byte
}

// stat reads path's metadata; ok is false when it does not exist.
func stat(path string) (n node, ok bool, err error) {
	if err := unix.Lstat(path, &n.st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return n, false, nil
		}
		return n, false, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	if n.st.Mode&unix.S_IFMT == unix.S_IFLNK {
		if n.link, err = os.Readlink(path); err != nil {
			return n, false, err
		}
	}
	n.xattrs, err = xattrs(path)
	return n, true, err
}

// xattrs returns path's extended attributes, or nil where the filesystem
// has none (zfs-fuse answers ENOTSUP).
func xattrs(path string) (map[string][]byte, error) {
	sz, err := unix.Llistxattr(path, nil)
	if err != nil || sz == 0 {
		if err == nil || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENODATA) {
			return nil, nil
		}
		return nil, &fs.PathError{Op: "listxattr", Path: path, Err: err}
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(path, buf); err != nil {
		return nil, &fs.PathError{Op: "listxattr", Path: path, Err: err}
	}
	out := map[string][]byte{}
	for name := range bytes.SplitSeq(buf[:sz], []byte{0}) {
		if len(name) == 0 {
			continue
		}
		vsz, err := unix.Lgetxattr(path, string(name), nil)
		if err != nil {
			continue
		}
		val := make([]byte, vsz)
		vsz, _ = unix.Lgetxattr(path, string(name), val)
		out[string(name)] = val[:max(vsz, 0)]
	}
	return out, nil
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

// differs applies the package's rule to two existing paths.
func differs(a, b *node) bool {
	if a.st.Mode != b.st.Mode || a.st.Ino != b.st.Ino || a.st.Uid != b.st.Uid ||
		a.st.Gid != b.st.Gid || a.st.Rdev != b.st.Rdev || a.link != b.link {
		return true
	}
	if !isDir(&a.st) && (a.st.Size != b.st.Size || a.st.Mtim != b.st.Mtim) {
		return true
	}
	if len(a.xattrs) != len(b.xattrs) {
		return true
	}
	for k, v := range a.xattrs {
		if w, ok := b.xattrs[k]; !ok || !bytes.Equal(v, w) {
			return true
		}
	}
	return false
}

// Set accumulates changes, one per path.
type Set map[string]cr.ChangeKind

// Sorted returns the changes ordered by path.
func (s Set) Sorted() []cr.Change {
	out := make([]cr.Change, 0, len(s))
	for p, k := range s {
		out = append(out, cr.Change{Path: p, Kind: k})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Compare classifies rel ("/" or "/a/b") between the trees at baseRoot and
// targetRoot and records it in s. forceModified marks a path known to have
// new content (a write seen in a change stream). An added or deleted
// directory brings all its descendants along.
func (s Set) Compare(ctx context.Context, baseRoot, targetRoot, rel string, forceModified bool) error {
	a, inBase, err := stat(filepath.Join(baseRoot, rel))
	if err != nil {
		return err
	}
	b, inTarget, err := stat(filepath.Join(targetRoot, rel))
	if err != nil {
		return err
	}
	switch {
	case inBase && inTarget:
		if differs(&a, &b) || forceModified && !isDir(&b.st) {
			s[rel] = cr.Modified
		}
	case inBase:
		s[rel] = cr.Deleted
		if isDir(&a.st) {
			return s.all(ctx, baseRoot, rel, cr.Deleted)
		}
	case inTarget:
		s[rel] = cr.Added
		if isDir(&b.st) {
			return s.all(ctx, targetRoot, rel, cr.Added)
		}
	}
	return nil
}

// all records every path below rel in root as kind.
func (s Set) all(ctx context.Context, root, rel string, kind cr.ChangeKind) error {
	start := filepath.Join(root, rel)
	return filepath.WalkDir(start, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == start {
			return nil
		}
		s["/"+filepath.ToSlash(p[len(root)+1:])] = kind
		return nil
	})
}

// Walk compares the whole trees at baseRoot and targetRoot.
//
// contentSince is for filesystems with coarse timestamps (zfs-fuse keeps
// whole seconds): a regular file whose size and mtime are equal on both
// sides but whose mtime is not older than contentSince (when the base was
// taken) may have been rewritten in that same second, so its contents are
// compared. The zero time turns this off.
func Walk(ctx context.Context, baseRoot, targetRoot string, contentSince time.Time) ([]cr.Change, error) {
	s := Set{}
	if err := s.walkDir(ctx, baseRoot, targetRoot, "/", contentSince); err != nil {
		return nil, err
	}
	return s.Sorted(), nil
}

func (s Set) walkDir(ctx context.Context, baseRoot, targetRoot, rel string, since time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.Compare(ctx, baseRoot, targetRoot, rel, false); err != nil {
		return err
	}
	if _, done := s[rel]; done && s[rel] != cr.Modified {
		return nil // added or deleted: descendants already recorded
	}
	if _, done := s[rel]; !done && !since.IsZero() {
		same, err := sameRecentContent(filepath.Join(baseRoot, rel), filepath.Join(targetRoot, rel), since)
		if err != nil {
			return err
		}
		if !same {
			s[rel] = cr.Modified
		}
	}
	names, bothDirs, err := union(filepath.Join(baseRoot, rel), filepath.Join(targetRoot, rel))
	if err != nil || !bothDirs {
		return err
	}
	for _, n := range names {
		if err := s.walkDir(ctx, baseRoot, targetRoot, filepath.Join(rel, n), since); err != nil {
			return err
		}
	}
	return nil
}

// sameRecentContent reports false when a and b are regular files with
// mtimes not before since and different contents.
func sameRecentContent(a, b string, since time.Time) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(b, &st); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mtim.Sec < since.Unix() {
		return true, nil
	}
	ca, err := os.ReadFile(a)
	if err != nil {
		return false, err
	}
	cb, err := os.ReadFile(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ca, cb), nil
}

// union lists the entry names of two directories; bothDirs is false when
// either side is not a directory.
func union(a, b string) (names []string, bothDirs bool, err error) {
	ea, err := os.ReadDir(a)
	if err != nil {
		return nil, false, ignoreNotDir(err)
	}
	eb, err := os.ReadDir(b)
	if err != nil {
		return nil, false, ignoreNotDir(err)
	}
	for _, e := range ea {
		names = append(names, e.Name())
	}
	for _, e := range eb {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return slices.Compact(names), true, nil
}

func ignoreNotDir(err error) error {
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
