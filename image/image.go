package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/arbor-env/arbor/cr"
)

// Prefix is the snapshot-name prefix under which images live.
const Prefix = "images/"

// MetadataPath is where an image's Info is stored inside its root.
const MetadataPath = "/.arbor-image.json"

// DefaultCacheDir holds build caches (finished root tarballs, downloaded
// .debs). It is a system path outside any state dir so that fresh clones and
// test pools on the same machine reuse it.
const DefaultCacheDir = "/var/cache/arbor/images"

// buildPrefix names the temporary volumes that builds fill before
// snapshotting. It lies outside Prefix so an unfinished build is never
// mistaken for an image, and it avoids dot names, which backends reserve.
const buildPrefix = "image-builds/"

// buildVolume names a new temporary build volume for what: under
// buildPrefix, with this process's pid first, so that one left behind
// by a process that died (a pull killed mid-layer) can be told from one
// in use (cleanStaleBuilds).
func buildVolume(what string) string {
	return buildPrefix + strconv.Itoa(os.Getpid()) + "-" + what + "-" + randSuffix()
}

// cleanStaleBuilds destroys the build volumes of processes that are gone:
// an interrupted pull or build starts clean. Errors are logged: they do
// not stop the build that asked.
func (s *Store) cleanStaleBuilds(ctx context.Context) {
	vols, err := s.Snap.List(ctx, buildPrefix)
	if err != nil {
		return
	}
	for _, v := range vols {
		rest, ok := strings.CutPrefix(v.Name, buildPrefix)
		pidStr, _, ok2 := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || !ok2 || err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		if err := s.destroyBuild(v.Name); err != nil {
			s.logger().Warn("remove stale build volume", slog.String("volume", v.Name), slog.Any("err", err))
			continue
		}
		s.logger().Info("removed stale build volume", slog.String("volume", v.Name), slog.Int("pid", pid))
	}
}

// processAlive reports whether process pid exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Info describes one image.
type Info struct {
	// Name is the image's name, e.g. "busybox".
	Name string `json:"name"`
	// Created is when the image was made.
	Created time.Time `json:"created"`
	// Source says what the image was made from.
	Source string `json:"source"`
	// Size is the disk space its files take, in bytes (before sharing).
	Size int64 `json:"size"`
	// Shell is the absolute in-image path of the shell sandboxes run:
	// /bin/bash where the image has it, else /bin/sh.
	Shell string `json:"shell"`
	// Snapshot is the read-only snapshot to clone, e.g. "images/busybox".
	Snapshot string `json:"snapshot"`
	// Path is where the image's files are visible on the host.
	Path string `json:"path"`
	// Digest is the manifest digest of an OCI image (pulled or imported
	// from an archive); "" for images built or imported from a tree.
	Digest string `json:"digest,omitempty"`
	// Layers are an OCI image's layers, bottom first: snapshots of their
	// own (LayerPrefix) that images with the same base share.
	Layers []Layer `json:"layers,omitempty"`
	// Config is what of an OCI image's config sandboxes use (nil: none).
	Config *Config `json:"config,omitempty"`
	// Recipe is the cache key of the recipe file the image was built from
	// (BuildRecipe); "" for other images.
	Recipe string `json:"recipe,omitempty"`
}

// metadata is what an image's /.arbor-image.json holds.
type metadata struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Source  string    `json:"source"`
	Size    int64     `json:"size"`
	Shell   string    `json:"shell"`
	Digest  string    `json:"digest,omitempty"`
	Layers  []Layer   `json:"layers,omitempty"`
	Config  *Config   `json:"config,omitempty"`
	Recipe  string    `json:"recipe,omitempty"`
}

// Store builds, imports, lists and removes images in a snapshotter.
type Store struct {
	// Snap holds the images.
	Snap cr.Snapshotter
	// CacheDir holds build caches; DefaultCacheDir when empty.
	CacheDir string
	// Logger receives structured logs; slog.Default() when nil.
	Logger *slog.Logger
	// Registry is how Pull reaches registries (loopback over plain HTTP,
	// the Docker config file's credentials, linux/GOARCH: by default).
	Registry Registry
}

// SnapshotName returns the snapshot name of image name.
func SnapshotName(name string) string { return Prefix + name }

// Up to 127 characters: a pulled image's DigestName is 71.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,126}$`)

// ValidName reports an error wrapping ErrInvalidName unless name can name
// an image.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	return nil
}

func (s *Store) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

func (s *Store) cacheDir() string {
	if s.CacheDir != "" {
		return s.CacheDir
	}
	return DefaultCacheDir
}

// Get returns the image called name, or an error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, name string) (Info, error) {
	if err := ValidName(name); err != nil {
		return Info{}, err
	}
	vols, err := s.Snap.List(ctx, SnapshotName(name))
	if err != nil {
		return Info{}, fmt.Errorf("list snapshots: %w", err)
	}
	for _, v := range vols {
		if v.Name == SnapshotName(name) {
			return s.info(name), nil
		}
	}
	return Info{}, fmt.Errorf("get image %s: %w", name, ErrNotFound)
}

// List returns every image, sorted by name.
func (s *Store) List(ctx context.Context) ([]Info, error) {
	vols, err := s.Snap.List(ctx, Prefix)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []Info
	for _, v := range vols {
		name, ok := strings.CutPrefix(v.Name, Prefix)
		// Everything directly under Prefix is an image (builds happen
		// elsewhere), so this does not rely on the backend reporting
		// ReadOnly.
		if !ok || ValidName(name) != nil {
			continue
		}
		out = append(out, s.info(name))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// info reads an image's metadata; an image made by hand without it still
// gets its name, snapshot, path and a shell found by looking.
func (s *Store) info(name string) Info {
	snap := SnapshotName(name)
	root := s.Snap.Path(snap)
	var md metadata
	if b, err := os.ReadFile(filepath.Join(root, MetadataPath)); err == nil {
		if err := json.Unmarshal(b, &md); err != nil {
			s.logger().Warn("image metadata unreadable", slog.String("image", name), slog.Any("err", err))
		}
	}
	in := Info{Name: name, Created: md.Created, Source: md.Source, Size: md.Size, Shell: md.Shell, Snapshot: snap, Path: root,
		Digest: md.Digest, Layers: md.Layers, Config: md.Config, Recipe: md.Recipe}
	if in.Shell == "" {
		in.Shell = detectShell(root)
	}
	return in
}

// Remove deletes the image called name. Sandboxes already cloned from it
// keep their files where the backend allows that (btrfs does; a zfs
// snapshot with clones refuses, and Remove returns that error).
func (s *Store) Remove(ctx context.Context, name string) error {
	if _, err := s.Get(ctx, name); err != nil {
		return err
	}
	if err := s.Snap.Destroy(ctx, SnapshotName(name)); err != nil {
		if errors.Is(err, cr.ErrNotFound) {
			return fmt.Errorf("remove image %s: %w", name, ErrNotFound)
		}
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	if err := s.removeShifted(ctx, name); err != nil { // user namespace mode: shifted.go
		return fmt.Errorf("remove image %s: shifted copies: %w", name, err)
	}
	if err := s.forgetRefs(name); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	if _, err := s.PruneLayers(ctx); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	return nil
}

// Import makes image name from a docker save archive or an OCI image
// layout (a directory or a tar of one), whose layers are stored once as a
// pull's are; or from a root file system: a directory tree or a tarball
// (tar, tar.gz, tar.xz, or tar.zst when zstd is installed), copying
// owners, modes, links, device nodes and extended attributes. Progress
// of an archive goes to progress (nil: none).
func (s *Store) Import(ctx context.Context, name, dirOrTarball string, progress io.Writer) error {
	src, err := filepath.Abs(dirOrTarball)
	if err != nil {
		return fmt.Errorf("import %s: %w", dirOrTarball, err)
	}
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("import %s: %w", dirOrTarball, err)
	}
	if err := ValidName(name); err != nil {
		return err
	}
	if _, err := s.Get(ctx, name); err == nil {
		return fmt.Errorf("import image %s: %w", name, ErrExists)
	}
	if ok, err := s.importArchive(ctx, name, src, progress); ok || err != nil {
		if err != nil {
			return fmt.Errorf("import %s: %w", dirOrTarball, err)
		}
		return nil
	}
	fill := func(ctx context.Context, root string, _ io.Writer) (metadata, error) {
		if st.IsDir() {
			return metadata{Source: src}, copyTree(ctx, src, root)
		}
		return metadata{Source: src}, Unpack(ctx, src, root)
	}
	return s.create(ctx, name, "", fill, io.Discard)
}

// fillFunc populates a root directory (empty, or a clone of create's
// base) and returns what the image's metadata says of its making (Source,
// and for OCI images Digest, Layers and Config).
type fillFunc func(ctx context.Context, root string, progress io.Writer) (metadata, error)

// create makes image name atomically: it fills a temporary volume (a
// clone of snapshot base, or empty when base is ""), writes the metadata,
// snapshots it read-only to images/<name> and destroys the temporary
// volume; on failure nothing is left behind. An image without a shell is
// refused (ErrNoShell): no sandbox could start on it.
func (s *Store) create(ctx context.Context, name, base string, fill fillFunc, progress io.Writer) (err error) {
	if err := ValidName(name); err != nil {
		return err
	}
	if _, err := s.Get(ctx, name); err == nil {
		return fmt.Errorf("create image %s: %w", name, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	log := s.logger().With(slog.String("image", name))
	start := time.Now()
	s.cleanStaleBuilds(ctx)
	tmp, done, err := s.newBuild(ctx, log, name, base)
	if err != nil {
		return fmt.Errorf("create build volume %s: %w", tmp, err)
	}
	defer done()
	root := s.Snap.Path(tmp)
	md, err := fill(ctx, root, progress)
	if err != nil {
		return fmt.Errorf("fill image %s: %w", name, err)
	}
	if err := ensureSkeleton(root); err != nil {
		return fmt.Errorf("fill image %s: %w", name, err)
	}
	shell, err := findShell(root)
	if err != nil {
		return fmt.Errorf("image %s: %w", name, err)
	}
	// A stale metadata file from an imported image must not survive.
	_ = os.Remove(filepath.Join(root, MetadataPath))
	size, err := diskUsage(root)
	if err != nil {
		return fmt.Errorf("measure image %s: %w", name, err)
	}
	md.Name, md.Created, md.Size, md.Shell = name, time.Now().UTC().Truncate(time.Second), size, shell
	b, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return fmt.Errorf("encode metadata: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, MetadataPath), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write metadata: %w", err)
	}
	if err := s.Snap.Snapshot(ctx, tmp, SnapshotName(name)); err != nil {
		if errors.Is(err, cr.ErrExists) {
			return fmt.Errorf("snapshot image %s: %w", name, errors.Join(ErrExists, err))
		}
		return fmt.Errorf("snapshot image %s: %w", name, err)
	}
	log.Info("image created", slog.String("source", md.Source), slog.Int64("size", size),
		slog.Duration("took", time.Since(start)))
	return nil
}

// newBuild makes a temporary build volume for what: a clone of snapshot
// base, or empty when base is "" (its name even on failure). done
// removes it, whether the build succeeded or not, logging a failure.
func (s *Store) newBuild(ctx context.Context, log *slog.Logger, what, base string) (tmp string, done func(), err error) {
	tmp = buildVolume(what)
	if base == "" {
		err = s.Snap.CreateVolume(ctx, tmp)
	} else {
		err = s.Snap.Clone(ctx, base, tmp)
	}
	if err != nil {
		return tmp, nil, err
	}
	return tmp, func() {
		if err := s.destroyBuild(tmp); err != nil {
			log.Warn("remove build volume", slog.String("volume", tmp), slog.Any("err", err))
		}
	}, nil
}

// destroyBuild removes a temporary build volume, first detaching anything a
// failed build left mounted inside it. It does not use the caller's context:
// cleanup must run even after a cancellation.
func (s *Store) destroyBuild(name string) error {
	if err := unmountUnder(s.Snap.Path(name)); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return s.Snap.Destroy(ctx, name)
}

func randSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ensureSkeleton creates the mount points and directories every sandbox
// root needs, when an imported tree lacks them.
func ensureSkeleton(root string) error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755},
		{"tmp", 0o777 | os.ModeSticky}, {"work", 0o755}, {"root", 0o700},
	} {
		p, err := resolveIn(root, d.path)
		if err != nil {
			return err
		}
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Mkdir(p, d.mode.Perm()); err != nil {
			return fmt.Errorf("make /%s: %w", d.path, err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("chmod /%s: %w", d.path, err)
		}
	}
	return nil
}

// detectShell returns /bin/bash when the tree at root has it, else /bin/sh.
func detectShell(root string) string {
	if isExecutable(root, "/bin/bash") {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// findShell is detectShell for a new image, which must have a shell.
func findShell(root string) (string, error) {
	sh := detectShell(root)
	if !isExecutable(root, sh) {
		return "", fmt.Errorf("%w: no executable /bin/bash or /bin/sh (Arbor runs a persistent shell in every sandbox: docs/images.md)", ErrNoShell)
	}
	return sh, nil
}

// isExecutable reports whether in-image path p (symlinks resolved inside
// root) is an executable regular file.
func isExecutable(root, p string) bool {
	hp, err := resolveIn(root, p)
	if err != nil {
		return false
	}
	st, err := os.Stat(hp)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
