// Package sandboxtest has test helpers for packages that start sandboxes:
// it finds (or builds) arbor-init and makes small root file systems.
package sandboxtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/arbor-env/arbor/image"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxes use namespaces, cgroups and mounts")
	}
}

// InitBinary returns a static arbor-init: $ARBOR_INIT when set (make test
// sets it), else one built once per test process with the go toolchain.
func InitBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("ARBOR_INIT"); p != "" {
		return p
	}
	p, err := BuildInit()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BuildInit is InitBinary for callers without a testing.TB (TestMain):
// $ARBOR_INIT when set, else arbor-init built once per process.
func BuildInit() (string, error) {
	if p := os.Getenv("ARBOR_INIT"); p != "" {
		return p, nil
	}
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		modRoot := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "arbor-init-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "arbor-init")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/arbor-init")
		cmd.Dir = modRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build arbor-init: %v: %s", err, out)
		}
	})
	return buildPath, buildErr
}

// BusyboxRoot makes a root file system from the host's static busybox in a
// fresh directory below dir (t.TempDir() when empty). It skips the test
// when busybox-static is not installed.
func BusyboxRoot(t testing.TB, dir string) string {
	t.Helper()
	bb := ""
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			bb = p
			break
		}
	}
	if bb == "" {
		t.Skip("busybox-static not installed: run make deps")
	}
	if dir == "" {
		dir = t.TempDir()
	}
	root := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "root", "tmp", "proc", "dev", "etc", "work"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			os.Symlink("busybox", filepath.Join(root, "bin", a))
		}
	}
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\n"), 0o644)
	return root
}

// DebianCache returns the cached Debian rootfs tarball that `arbor image
// build debian` keeps (in $ARBOR_IMAGE_CACHE, else image.DefaultCacheDir),
// whatever its compression. Tests reuse it rather than running
// debootstrap; make test fills it first (make test-images), so a missing
// cache fails the test.
func DebianCache(t testing.TB) string {
	t.Helper()
	s := &image.Store{CacheDir: os.Getenv("ARBOR_IMAGE_CACHE")}
	p, ok := s.DebianCache()
	if !ok {
		t.Fatalf("no cached debian rootfs (want %s): run make test-images (bin/arbor image build --cache-only debian)", p)
	}
	return p
}

// DebianRoot unpacks the cached Debian image into a fresh directory below
// dir (t.TempDir() when empty). A missing cache fails the test.
func DebianRoot(t testing.TB, dir string) string {
	t.Helper()
	cache := DebianCache(t)
	if dir == "" {
		dir = t.TempDir()
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := image.Unpack(context.Background(), cache, root); err != nil {
		t.Fatalf("unpack debian image: %v", err)
	}
	return root
}

var (
	forgerOnce sync.Once
	forgerPath string
	forgerErr  error
)

// Forger returns a static build of sandboxtest/forger (built once per test
// process), the helper that attacks init's control channel from inside a
// sandbox. Copy it into a root with InstallForger.
func Forger(t testing.TB) string {
	t.Helper()
	forgerOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		dir, err := os.MkdirTemp("", "arbor-forger-")
		if err != nil {
			forgerErr = err
			return
		}
		forgerPath = filepath.Join(dir, "forger")
		cmd := exec.Command("go", "build", "-o", forgerPath, "./forger")
		cmd.Dir = filepath.Dir(file)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			forgerErr = fmt.Errorf("build forger: %v: %s", err, out)
		}
	})
	if forgerErr != nil {
		t.Fatal(forgerErr)
	}
	return forgerPath
}

// InstallForger copies the forger to root/bin/forger.
func InstallForger(t testing.TB, root string) {
	t.Helper()
	data, err := os.ReadFile(Forger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "forger"), data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// ShiftRoot gives root to the id range base..base+size-1, as
// image.Store.Shifted does for images, so that a sandbox in user namespace
// mode can run on it.
func ShiftRoot(t testing.TB, root string, base, size uint32) {
	t.Helper()
	if err := image.Shift(root, base, size); err != nil {
		t.Fatalf("shift root: %v", err)
	}
}
