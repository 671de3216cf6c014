package image_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/image"
)

// btrfsStore opens a fresh btrfs pool in a temporary state dir, skipping
// when this host cannot run one.
func btrfsStore(t testing.TB, cacheDir string) (*image.Store, cr.Snapshotter) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (btrfs pool, chroot)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("btrfs-progs not installed: run make deps")
	}
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: t.TempDir(), PoolSize: 8 << 30})
	if errors.Is(err, cr.ErrUnavailable) {
		t.Skipf("btrfs unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := snap.Unmount(context.Background()); err != nil {
			t.Errorf("unmount pool: %v", err)
		}
	})
	return &image.Store{Snap: snap, CacheDir: cacheDir}, snap
}

func requireStaticBusybox(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(image.BusyboxPath); err != nil {
		t.Skip("busybox-static not installed: run make deps")
	}
}

// chroot runs a shell command inside root and returns its output.
func chroot(t *testing.T, root, shell, script string) string {
	t.Helper()
	out, err := exec.Command("chroot", root, shell, "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s %s -c %q: %v: %s", root, shell, script, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestIntegrationBusybox(t *testing.T) {
	requireStaticBusybox(t)
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	start := time.Now()
	if err := s.Build(ctx, "busybox", nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("busybox image built in %s", time.Since(start))
	in, err := s.Get(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("busybox image: %d bytes", in.Size)
	if got := chroot(t, in.Path, in.Shell, "echo ok"); got != "ok" {
		t.Fatalf("echo ok printed %q", got)
	}
	tests := []struct {
		name   string
		script string
		want   string
	}{
		{"arithmetic", "x=41; echo $((x+1))", "42"},
		{"hostname file", "cat /etc/hostname", "arbor"},
		{"usr applet", "echo a,b | cut -d, -f2", "b"},
		{"sbin applet", "test -L /sbin/ifconfig && echo yes", "yes"},
		{"tmp sticky", "stat -c %a /tmp", "1777"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chroot(t, in.Path, in.Shell, tt.script); got != tt.want {
				t.Fatalf("%q printed %q, want %q", tt.script, got, tt.want)
			}
		})
	}

	// The image is read-only; a sandbox root is a writable clone of it.
	err = os.WriteFile(filepath.Join(in.Path, "work/x"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("writing into the image: %v, want EROFS", err)
	}
	if err := snap.Clone(ctx, in.Snapshot, "sandboxes/imgtest"); err != nil {
		t.Fatal(err)
	}
	clone := snap.Path("sandboxes/imgtest")
	chroot(t, clone, in.Shell, "echo hi > /work/x")
	if _, err := os.Stat(filepath.Join(in.Path, "work/x")); !os.IsNotExist(err) {
		t.Errorf("a write to the clone reached the image: %v", err)
	}
	if err := snap.Destroy(ctx, "sandboxes/imgtest"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "busybox"); err != nil {
		t.Fatal(err)
	}
	if vols, err := snap.List(ctx, ""); err != nil || len(vols) != 0 {
		t.Fatalf("volumes left after Remove: %v, %v", vols, err)
	}
}

func TestIntegrationImportTarball(t *testing.T) {
	requireStaticBusybox(t)
	s, _ := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	if err := s.Build(ctx, "busybox", nil); err != nil {
		t.Fatal(err)
	}
	bb, err := s.Get(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), "bb.tar.gz")
	if out, err := exec.Command("tar", "-czf", tarball, "-C", bb.Path, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	if err := s.Import(ctx, "bb2", tarball, nil); err != nil {
		t.Fatal(err)
	}
	in, err := s.Get(ctx, "bb2")
	if err != nil {
		t.Fatal(err)
	}
	if in.Source != tarball {
		t.Errorf("source %q, want %q", in.Source, tarball)
	}
	if got := chroot(t, in.Path, in.Shell, "echo ok"); got != "ok" {
		t.Fatalf("echo ok printed %q", got)
	}
}

// TestIntegrationDebian builds the debian image from the shared cache,
// which make test fills first (make test-images); with no cached rootfs it
// fails, unless ARBOR_TEST_DEBIAN=1 asks for the full debootstrap
// (minutes; it fills the cache for later runs).
func TestIntegrationDebian(t *testing.T) {
	cacheDir := image.DefaultCacheDir
	if d := os.Getenv("ARBOR_IMAGE_CACHE"); d != "" {
		cacheDir = d
	}
	probe := &image.Store{CacheDir: cacheDir}
	if _, ok := probe.DebianCache(); !ok && os.Getenv("ARBOR_TEST_DEBIAN") != "1" {
		t.Fatalf("no cached debian rootfs in %s: run make test-images (bin/arbor image build --cache-only debian), or set ARBOR_TEST_DEBIAN=1", cacheDir)
	}
	s, _ := btrfsStore(t, cacheDir)
	ctx := context.Background()
	start := time.Now()
	if err := s.Build(ctx, "debian", testWriter{t}); err != nil {
		t.Fatal(err)
	}
	t.Logf("debian image built in %s", time.Since(start))
	in, err := s.Get(ctx, "debian")
	if err != nil {
		t.Fatal(err)
	}
	if in.Shell != "/bin/bash" {
		t.Errorf("shell %q, want /bin/bash", in.Shell)
	}
	t.Logf("debian image: %d bytes", in.Size)
	tests := []struct {
		name   string
		script string
		want   string
	}{
		{"bash", "echo $BASH_VERSION | cut -d. -f1", "5"},
		{"python3", "python3 -c 'print(6*7)'", "42"},
		{"git", "git --version | cut -d' ' -f1-2", "git version"},
		{"procps", "command -v ps pkill | wc -l", "2"},
		{"iproute2", "command -v ip", "/usr/sbin/ip"},
		{"release", ". /etc/os-release; echo $VERSION_CODENAME", "bookworm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chroot(t, in.Path, in.Shell, tt.script); got != tt.want {
				t.Fatalf("%q printed %q, want %q", tt.script, got, tt.want)
			}
		})
	}
}

// BenchmarkBuildBusybox measures making (and removing) the busybox image.
func BenchmarkBuildBusybox(b *testing.B) {
	requireStaticBusybox(b)
	s, _ := btrfsStore(b, b.TempDir())
	ctx := context.Background()
	for b.Loop() {
		if err := s.Build(ctx, "busybox", nil); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Remove(ctx, "busybox"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// testWriter sends build progress to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
