package image

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// debianSuite is the Debian release the debian image is made of.
const debianSuite = "bookworm"

// debianPackages are installed on top of debootstrap's minbase variant.
var debianPackages = []string{"bash", "coreutils", "procps", "python3", "git", "iproute2"}

// etcApt is where the host's apt configuration lives.
const etcApt = "/etc/apt"

// debianCacheBase names the cached rootfs tarball, without its extension.
const debianCacheBase = "debian-" + debianSuite + ".tar"

// cacheExts are the compressions a cached rootfs tarball may have, the
// preferred first; Unpack reads each of them.
var cacheExts = []string{".zst", ".gz"}

// DebianCache returns the path of the cached debian rootfs tarball,
// whatever its compression, and whether it exists; when it does not, the
// path is where a build stores it (zstd when installed, else gzip).
func (s *Store) DebianCache() (string, bool) {
	for _, ext := range cacheExts {
		p := filepath.Join(s.cacheDir(), debianCacheBase+ext)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, true
		}
	}
	ext := ".gz"
	if _, err := exec.LookPath("zstd"); err == nil {
		ext = ".zst"
	}
	return filepath.Join(s.cacheDir(), debianCacheBase+ext), false
}

// CacheDebian makes sure the debian rootfs cache exists and returns its
// path: when DebianCache finds none it runs debootstrap (minutes) into a
// temporary directory and caches the result. It needs no snapshotter; make
// test runs it (`arbor image build --cache-only debian`) so that the tests
// that unpack the cache find it.
func (s *Store) CacheDebian(ctx context.Context, progress io.Writer) (string, error) {
	if p, ok := s.DebianCache(); ok {
		return p, nil
	}
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(s.cacheDir(), 0o755); err != nil {
		return "", fmt.Errorf("make cache dir: %w", err)
	}
	tmp, err := os.MkdirTemp(s.cacheDir(), "debian-root-")
	if err != nil {
		return "", fmt.Errorf("make debian root: %w", err)
	}
	defer os.RemoveAll(tmp)
	// The tarball records its root's mode: a root file system's / is 0755.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("make debian root: %w", err)
	}
	if _, err := s.fillDebian(ctx, tmp, progress); err != nil {
		return "", err
	}
	p, ok := s.DebianCache()
	if !ok {
		return "", fmt.Errorf("cache debian rootfs: no tarball at %s after the build (see the log)", p)
	}
	return p, nil
}

// fillDebian unpacks the cached rootfs when there is one; otherwise it runs
// debootstrap against the host's own apt source and caches the result.
func (s *Store) fillDebian(ctx context.Context, root string, progress io.Writer) (string, error) {
	source := "debootstrap " + debianSuite + " minbase +" + strings.Join(debianPackages, ",")
	cache, ok := s.DebianCache()
	if ok {
		fmt.Fprintf(progress, "debian: unpacking cached rootfs %s\n", cache)
		start := time.Now()
		if err := Unpack(ctx, cache, root); err != nil {
			return "", fmt.Errorf("unpack cached rootfs (delete %s to rebuild it): %w", cache, err)
		}
		fmt.Fprintf(progress, "debian: unpacked in %s\n", time.Since(start).Round(time.Millisecond))
		// Caches made before CacheDebian set its root's mode recorded
		// MkdirTemp's 0700, which shut a non-root image user out of /.
		if err := os.Chmod(root, 0o755); err != nil {
			return "", fmt.Errorf("chmod debian root: %w", err)
		}
		return source + " (cached)", nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("%w: debootstrap", ErrMissingTool)
	}
	mirror, keyring, err := hostAptSource(etcApt, debianSuite, "main")
	if err != nil {
		return "", err
	}
	debs := filepath.Join(s.cacheDir(), "debs-"+debianSuite)
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", fmt.Errorf("make deb cache: %w", err)
	}
	args := []string{
		"--variant=minbase",
		"--include=" + strings.Join(debianPackages, ","),
		"--cache-dir=" + debs,
	}
	if keyring != "" {
		if _, err := os.Stat(keyring); err == nil {
			args = append(args, "--keyring="+keyring)
		}
	}
	args = append(args, debianSuite, root, mirror)
	fmt.Fprintf(progress, "debian: debootstrap %s from %s (a few minutes; cached afterwards)\n", debianSuite, mirror)
	start := time.Now()
	if err := run(ctx, progress, "debootstrap", args...); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "debian: debootstrap done in %s\n", time.Since(start).Round(time.Second))
	if err := tidyDebian(root); err != nil {
		return "", err
	}
	start = time.Now()
	if err := createTarball(ctx, root, cache); err != nil {
		// The image itself is fine; only the next build will be slow.
		s.logger().Warn("cache debian rootfs", slog.String("path", cache), slog.Any("err", err))
	} else {
		fmt.Fprintf(progress, "debian: cached rootfs at %s (%s)\n", cache, time.Since(start).Round(time.Millisecond))
	}
	return source, nil
}

// tidyDebian drops what a fresh debootstrap root carries that a sandbox
// does not need (downloaded package lists and .debs) and names the host.
func tidyDebian(root string) error {
	for _, pat := range []string{
		"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*",
	} {
		files, _ := filepath.Glob(filepath.Join(root, pat))
		for _, f := range files {
			if err := os.Remove(f); err != nil {
				return fmt.Errorf("tidy debian root: %w", err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("arbor\n"), 0o644); err != nil {
		return fmt.Errorf("tidy debian root: %w", err)
	}
	return nil
}
