package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Whiteout names of the OCI image spec (image-spec layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// ApplyTar applies one OCI layer, an uncompressed tar stream, to the
// tree at root (a clone of the layers below it), as the image spec's
// changeset rules say: entries add or replace paths, ".wh.NAME" deletes
// NAME of a lower layer and ".wh..wh..opq" empties its directory of what
// the lower layers put there. It returns the bytes of file content it
// wrote. The task grader writes an agent's outputs into a pristine tree
// with it too (docs/tasks.md, "The trusted grader").
//
// A layer is untrusted input. Every path is resolved inside root as a
// chroot would resolve it (openat2 with RESOLVE_IN_ROOT), so "..", an
// absolute symlink or a symlink planted by an earlier entry never reach
// outside root; the final component is never followed (a symlink in the
// way is replaced, not written through); device nodes are left out under
// /dev (a sandbox makes its own) and refused elsewhere (ErrBadLayer): a
// node would be a door to a host device. Owners, modes (set-id bits included),
// extended attributes (file capabilities) and times are kept.
func ApplyTar(ctx context.Context, root string, r io.Reader) (written int64, err error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open layer root %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	a := &applier{root: rootFD, mine: map[string]bool{}, buf: make([]byte, 1<<20), dirFD: -1}
	defer a.forget()
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if n%64 == 0 {
			if err := ctx.Err(); err != nil {
				return written, err
			}
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return written, fmt.Errorf("%w: read tar: %v", ErrBadLayer, err)
		}
		w, err := a.entry(ctx, hdr, tr)
		written += w
		if err != nil {
			return written, fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	// Directories last, deepest first: their entries changed their times.
	slices.SortFunc(a.dirTimes, func(x, y dirTime) int { return strings.Count(y.rel, "/") - strings.Count(x.rel, "/") })
	for _, d := range a.dirTimes {
		parent, base := splitRel(d.rel)
		if err := a.in(parent, func(dir int) error { return setTimes(dir, base, d.atime, d.mtime) }); err != nil && !errors.Is(err, unix.ENOENT) {
			return written, fmt.Errorf("set times of /%s: %w", d.rel, err)
		}
	}
	return written, nil
}

// applier is the state of one layer's application.
type applier struct {
	root int
	buf  []byte
	// dirRel and dirFD are the directory opened last: entries come
	// grouped by directory, so most need no open of their own. It stays
	// right: a change to any directory on its path (a removal, a
	// replacement) is made in that directory's parent, opened (and so
	// cached instead) for it. inUse counts the calls of in running, whose
	// fds a nested in (a hard link's target) must leave open.
	dirRel string
	dirFD  int
	inUse  int
	// mine are the paths this layer made: a whiteout or an opaque marker
	// removes only what lower layers made.
	mine     map[string]bool
	dirTimes []dirTime
}

type dirTime struct {
	rel          string
	atime, mtime time.Time
}

// entry applies one tar entry.
func (a *applier) entry(ctx context.Context, hdr *tar.Header, body io.Reader) (int64, error) {
	rel := cleanRel(hdr.Name)
	dir, base := splitRel(rel)
	switch {
	case base == whiteoutOpaque:
		return 0, a.opaque(dir)
	case strings.HasPrefix(base, whiteoutPrefix):
		victim := strings.TrimPrefix(base, whiteoutPrefix)
		if victim == "" || victim == "." || victim == ".." {
			return 0, fmt.Errorf("%w: whiteout of %q", ErrBadLayer, victim)
		}
		return 0, a.whiteout(path.Join(dir, victim))
	}
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		if dir == "dev" || strings.HasPrefix(dir, "dev/") {
			// Roots made by debootstrap (docker import) carry /dev's
			// nodes; a sandbox makes its own /dev, so they are left out.
			return 0, nil
		}
		return 0, fmt.Errorf("%w: device node %d:%d outside /dev (a sandbox makes its own /dev; a node elsewhere would open a host device)", ErrBadLayer, hdr.Devmajor, hdr.Devminor)
	case tar.TypeXGlobalHeader:
		return 0, nil
	}
	if rel == "" {
		// The root itself ("./"): its owner and mode only.
		if hdr.Typeflag != tar.TypeDir {
			return 0, fmt.Errorf("%w: the root is not a directory", ErrBadLayer)
		}
		return 0, a.attrs(a.root, ".", hdr, "")
	}
	if err := a.mkdirAll(dir); err != nil {
		return 0, err
	}
	var written int64
	err := a.in(dir, func(pfd int) error {
		// Make first, look only when something is in the way: a layer
		// mostly adds paths the layers below do not have.
		n, err := a.make(ctx, pfd, base, rel, hdr, body)
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("stat: %w", err)
			}
			if hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = nil // an existing directory stays, with new attributes
			} else {
				if err := removeAt(pfd, base, st.Mode); err != nil {
					return err
				}
				n, err = a.make(ctx, pfd, base, rel, hdr, body)
			}
		}
		written = n
		if err != nil {
			return err
		}
		a.mine[rel] = true
		if hdr.Typeflag == tar.TypeLink {
			return nil // a hard link shares its target's inode and attributes
		}
		if hdr.Typeflag == tar.TypeDir {
			a.dirTimes = append(a.dirTimes, dirTime{rel, hdr.AccessTime, hdr.ModTime})
		}
		return a.attrs(pfd, base, hdr, rel)
	})
	return written, err
}

// make creates base in dir as hdr says; an existing path is EEXIST.
func (a *applier) make(ctx context.Context, pfd int, base, rel string, hdr *tar.Header, body io.Reader) (int64, error) {
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return 0, mkErr("mkdir", err)
		}
	case tar.TypeReg, tar.TypeRegA:
		return writeFile(ctx, pfd, base, body, a.buf)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return 0, mkErr("symlink", err)
		}
	case tar.TypeLink:
		return 0, a.link(hdr.Linkname, pfd, base)
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return 0, mkErr("mkfifo", err)
		}
	default:
		return 0, fmt.Errorf("%w: tar entry type %q", ErrBadLayer, hdr.Typeflag)
	}
	return 0, nil
}

// mkErr wraps a failed create, keeping EEXIST as it is for make's caller.
func mkErr(what string, err error) error {
	if errors.Is(err, unix.EEXIST) {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// attrs sets the owner, mode, extended attributes and (but for
// directories, done last) times of base in dir from hdr.
func (a *applier) attrs(dir int, base string, hdr *tar.Header, rel string) error {
	if err := unix.Fchownat(dir, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After the chown, which clears set-id bits.
		if err := unix.Fchmodat(dir, base, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		p := "/proc/self/fd/" + strconv.Itoa(dir) + "/" + base
		if err := unix.Lsetxattr(p, name, []byte(v), 0); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	if hdr.Typeflag == tar.TypeDir || rel == "" {
		return nil
	}
	return setTimes(dir, base, hdr.AccessTime, hdr.ModTime)
}

// setTimes sets the times of base in dir, not following a symlink; a
// zero access time is the modification time.
func setTimes(dir int, base string, atime, mtime time.Time) error {
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(dir, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// writeFile creates base in dir (which must not exist: EEXIST) with body,
// copied through buf.
func writeFile(ctx context.Context, dir int, base string, body io.Reader, buf []byte) (int64, error) {
	fd, err := unix.Openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, mkErr("create", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	// Through buf as a plain writer: os.File's ReadFrom would copy a tar
	// entry in 32 KiB writes.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, ctxReader{ctx, body}, buf)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: truncated file: %v", ErrBadLayer, err)
		}
		return n, fmt.Errorf("write: %w", err)
	}
	return n, f.Close()
}

// ctxReader ends a long copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// link makes base in dir a hard link to the in-root path target, which an
// earlier entry or a lower layer made.
func (a *applier) link(target string, dir int, base string) error {
	trel := cleanRel(target)
	tdir, tbase := splitRel(trel)
	if tbase == "" {
		return fmt.Errorf("%w: hard link to the root", ErrBadLayer)
	}
	return a.in(tdir, func(tfd int) error {
		// No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink.
		if err := unix.Linkat(tfd, tbase, dir, base, 0); err != nil {
			return fmt.Errorf("hard link to /%s: %w", trel, err)
		}
		return nil
	})
}

// cleanRel is an archive path as a path relative to the root, without
// "..": the root for "/", "./" and "..".
func cleanRel(name string) string { return strings.TrimPrefix(path.Clean("/"+name), "/") }

// splitRel splits a cleaned relative path into its directory ("" for the
// root) and its last component.
func splitRel(rel string) (dir, base string) {
	dir, base = path.Split(rel)
	return strings.TrimSuffix(dir, "/"), base
}

// in opens the in-root directory rel (resolved inside the root as a
// chroot would, "" is the root) and calls f with it.
func (a *applier) in(rel string, f func(dir int) error) error {
	if a.dirFD >= 0 && a.dirRel == rel {
		a.inUse++
		defer func() { a.inUse-- }()
		return f(a.dirFD)
	}
	dir := rel
	if dir == "" {
		dir = "."
	}
	fd, err := unix.Openat2(a.root, dir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return fmt.Errorf("open /%s: %w", rel, err)
	}
	if a.inUse > 0 {
		defer unix.Close(fd)
		return f(fd)
	}
	a.forget()
	a.dirRel, a.dirFD = rel, fd
	a.inUse++
	defer func() { a.inUse-- }()
	return f(fd)
}

// forget closes the directory in keeps open.
func (a *applier) forget() {
	if a.dirFD >= 0 {
		unix.Close(a.dirFD)
		a.dirFD = -1
	}
}

// mkdirAll makes the in-root directory rel and its missing parents
// (root-owned, 0755), as tar does for an entry whose directories the
// archive does not list.
func (a *applier) mkdirAll(rel string) error {
	if rel == "" {
		return nil
	}
	err := a.in(rel, func(int) error { return nil })
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return err
	}
	parent, base := splitRel(rel)
	if err := a.mkdirAll(parent); err != nil {
		return err
	}
	return a.in(parent, func(pfd int) error {
		if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir /%s: %w", rel, err)
		}
		return nil
	})
}

// whiteout deletes the in-root path rel that a lower layer made; a path
// that is not there is fine (the spec allows whiteouts of nothing).
func (a *applier) whiteout(rel string) error {
	if a.mine[rel] {
		return nil
	}
	dir, base := splitRel(rel)
	if base == "" {
		return fmt.Errorf("%w: whiteout of the root", ErrBadLayer)
	}
	err := a.in(dir, func(pfd int) error {
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
		return removeAt(pfd, base, st.Mode)
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	return err
}

// opaque empties the in-root directory rel of what lower layers put there.
func (a *applier) opaque(rel string) error {
	if err := a.mkdirAll(rel); err != nil {
		return err
	}
	return a.in(rel, func(dfd int) error {
		fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /%s: %w", rel, err)
		}
		f := os.NewFile(uintptr(fd), rel)
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return fmt.Errorf("list /%s: %w", rel, err)
		}
		for _, n := range names {
			if a.mine[path.Join(rel, n)] {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(dfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("stat /%s: %w", path.Join(rel, n), err)
			}
			if err := removeAt(dfd, n, st.Mode); err != nil {
				return err
			}
		}
		return nil
	})
}

// removeAt removes base in dir, a whole tree when it is a directory,
// never following a symlink.
func removeAt(dir int, base string, mode uint32) error {
	if mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dir, base, 0); err != nil {
			return fmt.Errorf("remove: %w", err)
		}
		return nil
	}
	// RemoveAll works below an fd path without following symlinks.
	if err := os.RemoveAll("/proc/self/fd/" + strconv.Itoa(dir) + "/" + base); err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	return nil
}
