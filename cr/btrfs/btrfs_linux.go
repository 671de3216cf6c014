package btrfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/arbor-env/arbor/cr"
	"golang.org/x/sys/unix"
)

var (
	_ cr.Snapshotter = (*Snapshotter)(nil)
	_ cr.AheadCloner = (*Snapshotter)(nil)
)

// tmpDir holds short-lived read-only snapshots taken by Changes.
const tmpDir = ".arbor-tmp"

// Open prepares the pool under opts.StateDir (see the package comment). It
// returns an error wrapping cr.ErrUnavailable when not root, or when a pool
// file must be made and btrfs-progs are not installed.
func Open(ctx context.Context, opts Options) (*Snapshotter, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("open btrfs pool: not root: %w", cr.ErrUnavailable)
	}
	if opts.StateDir == "" {
		return nil, errors.New("open btrfs pool: no state dir")
	}
	state, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("open btrfs pool: %w", err)
	}
	s := &Snapshotter{root: filepath.Join(state, "pool"), log: opts.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(s.root, 0o700); err != nil {
		return nil, fmt.Errorf("open btrfs pool: %w", err)
	}
	stateBtrfs, err := onBtrfs(state)
	if err != nil {
		return nil, fmt.Errorf("open btrfs pool: %w", err)
	}
	if !stateBtrfs {
		s.img = filepath.Join(state, "pool.img")
		if err := s.mountPool(ctx, opts.PoolSize); err != nil {
			return nil, fmt.Errorf("open btrfs pool %s: %w", s.img, err)
		}
	}
	if ok, err := onBtrfs(s.root); err != nil || !ok {
		return nil, fmt.Errorf("open btrfs pool: %s is not on btrfs (%v): %w", s.root, err, cr.ErrUnavailable)
	}
	// Leftovers of a Changes call interrupted by a crash, and of sandboxes
	// whose checkpoints are gone.
	s.pruneTmp()
	if _, err := s.pruneQgroups(ctx); err != nil {
		s.log.WarnContext(ctx, "prune stale qgroups", slog.Any("err", err))
	}
	return s, nil
}

// mountPool loop-mounts s.img at s.root, making and formatting the file
// first if it does not exist; an existing mount is reused.
func (s *Snapshotter) mountPool(ctx context.Context, size int64) error {
	if mnt, err := isMountPoint(s.root); err != nil {
		return err
	} else if mnt {
		if ok, _ := onBtrfs(s.root); !ok {
			return fmt.Errorf("%s is mounted but not btrfs", s.root)
		}
		s.mounted = true
		s.log.DebugContext(ctx, "reuse btrfs pool mount", slog.String("path", s.root))
		return nil
	}
	if _, err := os.Stat(s.img); errors.Is(err, fs.ErrNotExist) {
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
			return fmt.Errorf("btrfs-progs not installed (run make deps): %w", cr.ErrUnavailable)
		}
		if size <= 0 {
			size = DefaultPoolSize
		}
		if err := makePoolFile(ctx, s.img, size); err != nil {
			return err
		}
		s.log.InfoContext(ctx, "made btrfs pool file", slog.String("path", s.img), slog.Int64("size", size))
	} else if err != nil {
		return err
	}
	// mount(8) sets up the loop device with autoclear, so unmounting frees it.
	if out, err := exec.CommandContext(ctx, "mount", "-t", "btrfs", "-o", "loop,noatime", s.img, s.root).CombinedOutput(); err != nil {
		return fmt.Errorf("mount: %w: %s", err, strings.TrimSpace(string(out)))
	}
	s.mounted = true
	s.log.InfoContext(ctx, "mounted btrfs pool", slog.String("path", s.root))
	return nil
}

func makePoolFile(ctx context.Context, img string, size int64) (err error) {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	if err = f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "mkfs.btrfs", "-q", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.btrfs: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// isMountPoint reports whether dir is on a different device than its parent.
func isMountPoint(dir string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Stat(filepath.Dir(dir), &pst); err != nil {
		return false, err
	}
	return st.Dev != pst.Dev, nil
}

// Close releases nothing today and leaves the pool mounted, so that the
// next Open (or another process) finds it as it was.
func (s *Snapshotter) Close() error { return nil }

// Unmount unmounts a loop-mounted pool, which also frees its loop device.
// It is for tests and teardown; volumes stay in the pool file.
func (s *Snapshotter) Unmount(ctx context.Context) error {
	if !s.mounted {
		return nil
	}
	if err := unix.Unmount(s.root, 0); err != nil {
		return fmt.Errorf("unmount btrfs pool %s: %w", s.root, err)
	}
	s.mounted = false
	return nil
}

// Path returns the directory of the volume called name.
func (s *Snapshotter) Path(name string) string {
	return filepath.Join(s.root, filepath.FromSlash(name))
}

// prepare checks name for a new volume and makes its parent directories,
// refusing a name below an existing volume. The caller holds s.dirs for
// reading.
func (s *Snapshotter) prepare(name string) (parent, base string, err error) {
	if err := cr.CheckName(name); err != nil {
		return "", "", err
	}
	dir := path.Dir(name)
	for d := dir; d != "."; d = path.Dir(d) {
		sub, _, err := isSubvol(s.Path(d))
		if err != nil {
			return "", "", err
		}
		if sub {
			return "", "", fmt.Errorf("%s is inside volume %s: %w", name, d, cr.ErrInvalidName)
		}
	}
	if _, err := os.Lstat(s.Path(name)); err == nil {
		return "", "", fmt.Errorf("%s: %w", name, cr.ErrExists)
	}
	parent = s.Path(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", "", err
	}
	return parent, path.Base(name), nil
}

// source returns the path of the existing volume called name.
func (s *Snapshotter) source(name string) (string, error) {
	if err := cr.CheckName(name); err != nil {
		return "", err
	}
	p := s.Path(name)
	sub, _, err := isSubvol(p)
	if err != nil {
		return "", err
	}
	if !sub {
		return "", fmt.Errorf("%s: %w", name, cr.ErrNotFound)
	}
	return p, nil
}

func mapErrno(name string, err error) error {
	switch {
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrExists, err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrNotFound, err)
	case errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrNotEmpty, err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOTTY):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrUnavailable, err)
	}
	return err
}

// CreateVolume makes an empty subvolume.
func (s *Snapshotter) CreateVolume(ctx context.Context, name string) error {
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	parent, base, err := s.prepare(name)
	if err == nil {
		err = mapErrno(name, createSubvol(parent, base))
	}
	if err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	return nil
}

// Snapshot makes a read-only snapshot of src called dst.
func (s *Snapshotter) Snapshot(ctx context.Context, src, dst string) error {
	if err := s.snapshot(src, dst, true); err != nil {
		return fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
	}
	return nil
}

// CloneAhead reports that clones may run beside the pool's other
// operations (cr.AheadCloner).
func (s *Snapshotter) CloneAhead() bool { return true }

// Clone makes a writable snapshot of src called dst.
func (s *Snapshotter) Clone(ctx context.Context, src, dst string) error {
	if err := s.snapshot(src, dst, false); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}

func (s *Snapshotter) snapshot(src, dst string, readOnly bool) error {
	srcPath, err := s.source(src)
	if err != nil {
		return err
	}
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	parent, base, err := s.prepare(dst)
	if err != nil {
		return err
	}
	return mapErrno(dst, snapshotSubvol(srcPath, parent, base, readOnly))
}

// Destroy deletes the subvolume called name and prunes parent directories
// left empty. A subvolume that contains other subvolumes (made inside it
// behind Arbor's back) is refused with cr.ErrNotEmpty.
func (s *Snapshotter) Destroy(ctx context.Context, name string) error {
	p, err := s.source(name)
	if err == nil {
		err = mapErrno(name, destroySubvol(filepath.Dir(p), filepath.Base(p)))
	}
	if err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	s.capped.Delete(name)
	if s.destroys.Add(1)%pruneEvery == 0 {
		if _, err := s.pruneQgroups(ctx); err != nil {
			s.log.WarnContext(ctx, "prune stale qgroups", slog.Any("err", err))
		}
	}
	s.dirs.Lock()
	defer s.dirs.Unlock()
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if os.Remove(s.Path(d)) != nil {
			break
		}
	}
	return nil
}

// List walks the pool's directories (not the volumes' contents) for
// subvolumes whose names start with prefix. Parent is the subvolume a
// snapshot or clone was taken from, while it exists.
func (s *Snapshotter) List(ctx context.Context, prefix string) ([]cr.Volume, error) {
	type found struct {
		vol        cr.Volume
		parentUUID [16]byte
	}
	var all []found
	byUUID := map[[16]byte]string{}
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // destroyed while we walked
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == s.root {
			return nil
		}
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		sub, _, err := isSubvol(p)
		if err != nil || !sub {
			return err
		}
		info, err := getSubvolInfo(p)
		if errors.Is(err, unix.ENOENT) {
			return filepath.SkipDir
		}
		if err != nil {
			return fmt.Errorf("subvolume info %s: %w", p, err)
		}
		name := filepath.ToSlash(p[len(s.root)+1:])
		byUUID[info.uuid] = name
		all = append(all, found{cr.Volume{Name: name, ReadOnly: info.flags&rootSubvolRdonly != 0}, info.parentUUID})
		return filepath.SkipDir
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	var out []cr.Volume
	for _, f := range all {
		if !strings.HasPrefix(f.vol.Name, prefix) {
			continue
		}
		f.vol.Parent = byUUID[f.parentUUID]
		out = append(out, f.vol)
	}
	return out, nil
}

// tmpSnapshot takes a read-only snapshot of the volume at p under tmpDir
// and returns its path and a function that destroys it.
func (s *Snapshotter) tmpSnapshot(p string) (string, func(), error) {
	dir := filepath.Join(s.root, tmpDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	var b [8]byte
	rand.Read(b[:])
	name := hex.EncodeToString(b[:])
	if err := snapshotSubvol(p, dir, name, true); err != nil {
		return "", nil, err
	}
	return filepath.Join(dir, name), func() {
		if err := destroySubvol(dir, name); err != nil {
			s.log.Warn("destroy temporary snapshot", slog.String("name", name), slog.Any("err", err))
		}
	}, nil
}

func (s *Snapshotter) pruneTmp() {
	dir := filepath.Join(s.root, tmpDir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if err := destroySubvol(dir, e.Name()); err != nil {
			s.log.Warn("destroy stale temporary snapshot", slog.String("name", e.Name()), slog.Any("err", err))
		}
	}
}
