package zfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/internal/fsdiff"
	gozfs "github.com/mistifyio/go-zfs/v3"
)

var _ cr.Snapshotter = (*Snapshotter)(nil)

// Open uses (and makes, if missing) the root dataset opts.Dataset, or with
// no Dataset the pool it makes or imports in opts.StateDir; with a
// StateDir it first prepares the host (PrepareHost). It returns an error
// wrapping cr.ErrUnavailable when the zfs tools are missing, the caller is
// not root, or ZFS does not answer (no kernel module, zfs-fuse neither
// running nor startable).
func Open(ctx context.Context, opts Options) (*Snapshotter, error) {
	if _, err := exec.LookPath("zfs"); err != nil {
		return nil, fmt.Errorf("open zfs: zfs tools not installed (run make deps): %w", cr.ErrUnavailable)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("open zfs: not root: %w", cr.ErrUnavailable)
	}
	if (opts.Dataset == "" && opts.StateDir == "") || strings.ContainsAny(opts.Dataset, "@ ") {
		return nil, fmt.Errorf("open zfs: bad root dataset %q", opts.Dataset)
	}
	s := &Snapshotter{root: opts.Dataset, log: opts.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if opts.StateDir != "" {
		dir := filepath.Join(opts.StateDir, stateSub)
		h, err := PrepareHost(ctx, dir, s.log)
		if err != nil {
			return nil, fmt.Errorf("open zfs: %w", err)
		}
		s.host = h
		if s.root == "" {
			pool, err := ownPool(ctx, opts.StateDir, dir, opts.PoolSize, s.log)
			if err != nil {
				h.Close()
				return nil, fmt.Errorf("open zfs: %w", err)
			}
			s.pool, s.root = pool, pool+"/"+rootName
		}
	}
	s2, err := s.openRoot()
	if err != nil {
		s.Unmount(context.WithoutCancel(ctx))
		return nil, err
	}
	return s2, nil
}

// openRoot uses (and makes, if missing) the root dataset.
func (s *Snapshotter) openRoot() (*Snapshotter, error) {
	ds, err := gozfs.GetDataset(s.root)
	if err != nil && errors.Is(mapErr(s.root, err), cr.ErrNotFound) {
		ds, err = gozfs.CreateFilesystem(s.root, map[string]string{kindProp: kindDir})
	}
	if err != nil {
		err = mapErr(s.root, err)
		if !errors.Is(err, cr.ErrUnavailable) && !errors.Is(err, cr.ErrNotFound) {
			// Anything else (e.g. go-zfs cannot parse this zfs's output).
			err = fmt.Errorf("%w: %w", cr.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("open zfs dataset %s: %w", s.root, err)
	}
	if ds.Mountpoint == "" || !filepath.IsAbs(ds.Mountpoint) {
		return nil, fmt.Errorf("open zfs dataset %s: not mounted (mountpoint %q)", s.root, ds.Mountpoint)
	}
	s.mount = ds.Mountpoint
	return s, nil
}

// Close releases nothing; datasets stay as they are.
func (s *Snapshotter) Close() error { return nil }

// Path returns the mountpoint of the dataset for name.
func (s *Snapshotter) Path(name string) string {
	return filepath.Join(s.mount, filepath.FromSlash(name))
}

func (s *Snapshotter) ds(name string) string { return s.root + "/" + name }

// mapErr turns a zfs command failure into the cr sentinels.
func mapErr(name string, err error) error {
	if err == nil {
		return nil
	}
	var ze *gozfs.Error
	msg := err.Error()
	if errors.As(err, &ze) {
		msg = ze.Stderr
	}
	switch {
	case strings.Contains(msg, "does not exist"):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrNotFound, err)
	case strings.Contains(msg, "already exists"):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrExists, err)
	case strings.Contains(msg, "has children"):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrNotEmpty, err)
	case strings.Contains(msg, "failed to initialize ZFS library"),
		strings.Contains(msg, "daemon is running"),
		strings.Contains(msg, "/dev/zfs"):
		return fmt.Errorf("%s: %w: %w", name, cr.ErrUnavailable, err)
	}
	return err
}

// kind reads arbor:kind of name's dataset; "" when it does not exist.
func (s *Snapshotter) kind(name string) (string, error) {
	v, err := (&gozfs.Dataset{Name: s.ds(name)}).GetProperty(kindProp)
	if err != nil {
		if err := mapErr(name, err); errors.Is(err, cr.ErrNotFound) {
			return "", nil
		} else {
			return "", err
		}
	}
	if v == "-" {
		v = kindDir // made outside Arbor: treat as a directory
	}
	return v, nil
}

// source checks that name is a volume or snapshot.
func (s *Snapshotter) source(name string) error {
	if err := cr.CheckName(name); err != nil {
		return err
	}
	k, err := s.kind(name)
	if err != nil {
		return err
	}
	if k != kindVolume && k != kindSnapshot {
		return fmt.Errorf("%s: %w", name, cr.ErrNotFound)
	}
	return nil
}

// prepare checks that name is free and makes its parent datasets. The
// caller holds s.dirs for reading.
func (s *Snapshotter) prepare(name string) error {
	if err := cr.CheckName(name); err != nil {
		return err
	}
	var missing []string
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		k, err := s.kind(d)
		if err != nil {
			return err
		}
		if k == kindVolume || k == kindSnapshot {
			return fmt.Errorf("%s is inside volume %s: %w", name, d, cr.ErrInvalidName)
		}
		if k != "" {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		_, err := gozfs.CreateFilesystem(s.ds(missing[i]), map[string]string{kindProp: kindDir})
		if err = mapErr(missing[i], err); err != nil && !errors.Is(err, cr.ErrExists) {
			return err
		}
	}
	if k, err := s.kind(name); err != nil {
		return err
	} else if k != "" {
		return fmt.Errorf("%s: %w", name, cr.ErrExists)
	}
	return nil
}

// CreateVolume makes an empty filesystem dataset.
func (s *Snapshotter) CreateVolume(ctx context.Context, name string) error {
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	err := s.prepare(name)
	if err == nil {
		_, err = gozfs.CreateFilesystem(s.ds(name), map[string]string{kindProp: kindVolume})
		err = mapErr(name, err)
	}
	if err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	return nil
}

// Snapshot makes a read-only clone of a fresh ZFS snapshot of src.
func (s *Snapshotter) Snapshot(ctx context.Context, src, dst string) error {
	if err := s.cloneOf(src, dst, true); err != nil {
		return fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
	}
	return nil
}

// Clone makes a writable clone of a fresh ZFS snapshot of src.
func (s *Snapshotter) Clone(ctx context.Context, src, dst string) error {
	if err := s.cloneOf(src, dst, false); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}

func (s *Snapshotter) cloneOf(src, dst string, readOnly bool) (err error) {
	if err := s.source(src); err != nil {
		return err
	}
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	if err := s.prepare(dst); err != nil {
		return err
	}
	var b [6]byte
	rand.Read(b[:])
	snap, err := (&gozfs.Dataset{Name: s.ds(src)}).Snapshot("arbor-"+hex.EncodeToString(b[:]), false)
	if err != nil {
		return mapErr(src, err)
	}
	defer func() {
		if err != nil {
			if derr := snap.Destroy(gozfs.DestroyDefault); derr != nil { // a snapshot: no mount
				s.log.Warn("undo zfs snapshot", slog.String("snapshot", snap.Name), slog.Any("err", derr))
			}
		}
	}()
	props := map[string]string{kindProp: kindVolume}
	if readOnly {
		props = map[string]string{kindProp: kindSnapshot, "readonly": "on"}
	}
	_, err = snap.Clone(s.ds(dst), props)
	return mapErr(dst, err)
}

// Destroy removes a volume or snapshot, promoting a clone first while any
// of its ZFS snapshots has clones (see the package comment). A volume with
// datasets below it (made outside Arbor) is refused with cr.ErrNotEmpty.
func (s *Snapshotter) Destroy(ctx context.Context, name string) error {
	if err := s.destroy(ctx, name); err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	return nil
}

func (s *Snapshotter) destroy(ctx context.Context, name string) error {
	if err := s.source(name); err != nil {
		return err
	}
	target := s.ds(name)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		all, err := s.namesAndOrigins(ctx)
		if err != nil {
			return mapErr(name, err)
		}
		var self *gozfs.Dataset
		var snaps []string
		clones := map[string][]string{} // origin snapshot -> clones
		for _, d := range all {
			switch {
			case d.Name == target:
				self = d
			case strings.HasPrefix(d.Name, target+"/"):
				return fmt.Errorf("%w: dataset %s", cr.ErrNotEmpty, d.Name)
			case strings.HasPrefix(d.Name, target+"@"):
				snaps = append(snaps, d.Name)
			}
			if d.Origin != "" {
				clones[d.Origin] = append(clones[d.Origin], d.Name)
			}
		}
		if self == nil {
			return fmt.Errorf("%s: %w", name, cr.ErrNotFound)
		}
		// zfs list orders a dataset's snapshots oldest first.
		promote := ""
		for _, sn := range snaps {
			if c := clones[sn]; len(c) > 0 {
				promote = c[len(c)-1]
			}
		}
		if promote != "" {
			s.log.DebugContext(ctx, "promote clone", slog.String("clone", promote), slog.String("for", target))
			if err := run(ctx, "promote", promote); err != nil {
				return err
			}
			continue
		}
		// zfs-fuse reports a mounted dataset as busy to destroy, even with
		// -f, until it is unmounted first.
		if err := destroyMounted(ctx, self, gozfs.DestroyRecursive); err != nil {
			return mapErr(name, err)
		}
		if o := self.Origin; o != "" && len(clones[o]) == 1 && strings.Contains(o, "@arbor-") {
			if err := (&gozfs.Dataset{Name: o}).Destroy(gozfs.DestroyDefault); err != nil {
				s.log.Warn("destroy unused origin snapshot", slog.String("snapshot", o), slog.Any("err", err))
			}
		}
		break
	}
	s.dirs.Lock()
	defer s.dirs.Unlock()
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		out, err := output(ctx, "list", "-H", "-o", "name", "-d", "1", "-r", s.ds(d))
		if err != nil || strings.Count(out, "\n") != 1 {
			break // d has children (or is gone)
		}
		if err := destroyMounted(ctx, &gozfs.Dataset{Name: s.ds(d)}, gozfs.DestroyDefault); err != nil {
			s.log.Warn("prune parent dataset", slog.String("dataset", s.ds(d)), slog.Any("err", err))
			run(ctx, "mount", s.ds(d))
			break
		}
	}
	return nil
}

// namesAndOrigins lists every dataset and snapshot below the root (the
// root included) with its origin ("" for none), in zfs list order (a
// dataset's snapshots oldest first). One `zfs list -H -o name,origin`:
// go-zfs's Datasets reads 13 properties of each (through the zfs-fuse
// shim, two more zfs runs and a get of every dataset), which made each
// Destroy cost seconds once a pool held a thousand datasets.
func (s *Snapshotter) namesAndOrigins(ctx context.Context) ([]*gozfs.Dataset, error) {
	out, err := output(ctx, "list", "-H", "-r", "-t", "all", "-o", "name,origin", s.root)
	if err != nil {
		return nil, err
	}
	var ds []*gozfs.Dataset
	for l := range strings.Lines(out) {
		name, origin, ok := strings.Cut(strings.TrimSuffix(l, "\n"), "\t")
		if !ok {
			continue
		}
		if origin == "-" {
			origin = ""
		}
		ds = append(ds, &gozfs.Dataset{Name: name, Origin: origin})
	}
	return ds, nil
}

// destroyMounted unmounts ds and destroys it (with its snapshots, given
// DestroyRecursive). zfs-fuse can still call it busy for a moment after
// the unmount (seen right after writes, and when pruning an emptied parent
// under load: the conformance suite then found the parent still there), so
// a busy answer is retried for up to about two seconds.
func destroyMounted(ctx context.Context, ds *gozfs.Dataset, flags gozfs.DestroyFlag) error {
	for try := 0; ; try++ {
		if err := unmount(ctx, ds.Name); err != nil {
			return err
		}
		err := ds.Destroy(flags)
		if err == nil || try == 20 || !strings.Contains(err.Error()+stderrOf(err), "busy") {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func stderrOf(err error) string {
	var ze *gozfs.Error
	if errors.As(err, &ze) {
		return ze.Stderr
	}
	return ""
}

// unmount unmounts a filesystem dataset; one already unmounted is fine.
func unmount(ctx context.Context, ds string) error {
	if err := run(ctx, "umount", ds); err != nil && !strings.Contains(err.Error(), "not currently mounted") {
		return err
	}
	return nil
}

// run calls the zfs command for what go-zfs v3 does not wrap (promote,
// bulk reads of user properties).
func run(ctx context.Context, args ...string) error {
	_, err := output(ctx, args...)
	return err
}

func output(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "zfs", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", mapErr(strings.Join(args, " "), &gozfs.Error{Err: err, Debug: "zfs " + strings.Join(args, " "), Stderr: stderr.String()})
	}
	return stdout.String(), nil
}

// List reads arbor:kind and origin of every dataset below the root in one
// `zfs get -r` (go-zfs has no bulk read of user properties).
func (s *Snapshotter) List(ctx context.Context, prefix string) ([]cr.Volume, error) {
	out, err := output(ctx, "get", "-H", "-r", "-o", "name,property,value", kindProp+",origin", s.root)
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	kinds, origins := map[string]string{}, map[string]string{}
	var order []string
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 || strings.Contains(f[0], "@") || !strings.HasPrefix(f[0], s.root+"/") {
			continue
		}
		name := strings.TrimPrefix(f[0], s.root+"/")
		switch f[1] {
		case kindProp:
			kinds[name] = f[2]
			order = append(order, name)
		case "origin":
			origins[name] = f[2]
		}
	}
	var vols []cr.Volume
	for _, name := range order {
		k := kinds[name]
		if (k != kindVolume && k != kindSnapshot) || !strings.HasPrefix(name, prefix) {
			continue
		}
		v := cr.Volume{Name: name, ReadOnly: k == kindSnapshot}
		if o, _, ok := strings.Cut(origins[name], "@"); ok && strings.HasPrefix(o, s.root+"/") {
			v.Parent = strings.TrimPrefix(o, s.root+"/")
		}
		vols = append(vols, v)
	}
	return vols, nil
}

// Changes walks the trees of base and target and compares them with the
// rule of cr/internal/fsdiff. zfs-fuse has no `zfs diff`, so this is the
// only path; a live target is read as it is during the walk, not frozen.
func (s *Snapshotter) Changes(ctx context.Context, base, target string) ([]cr.Change, error) {
	for _, n := range []string{base, target} {
		if err := s.source(n); err != nil {
			return nil, fmt.Errorf("changes %s..%s: %w", base, target, err)
		}
	}
	// zfs-fuse's timestamps are whole seconds: files touched in or after the
	// second the base was taken have their contents compared.
	out, err := output(ctx, "get", "-Hp", "-o", "value", "creation", s.ds(base))
	if err != nil {
		return nil, fmt.Errorf("changes %s..%s: %w", base, target, err)
	}
	created, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("changes %s..%s: creation time %q: %w", base, target, out, err)
	}
	ch, err := fsdiff.Walk(ctx, s.Path(base), s.Path(target), time.Unix(created-1, 0))
	if err != nil {
		return nil, fmt.Errorf("changes %s..%s: %w", base, target, err)
	}
	return ch, nil
}
