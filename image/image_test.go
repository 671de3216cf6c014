package image

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"plain", "busybox", true},
		{"digits and dash", "debian-12.5_x", true},
		{"empty", "", false},
		{"leading dot", ".build-x", false},
		{"slash", "a/b", false},
		{"upper", "Busybox", false},
		{"dotdot", "..", false},
		{"longest", strings.Repeat("a", 127), true},
		{"digest name", "sha256-" + strings.Repeat("ab", 32), true},
		{"too long", strings.Repeat("a", 128), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidName(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidName(%q) = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidName) {
				t.Fatalf("error %v does not wrap ErrInvalidName", err)
			}
		})
	}
}

func TestSniffCompression(t *testing.T) {
	tests := []struct {
		name string
		head []byte
		want compression
	}{
		{"gzip", []byte{0x1f, 0x8b, 8, 0}, compGzip},
		{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd, 0}, compZstd},
		{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0, 0}, compXz},
		{"bzip2", []byte("BZh91AY"), compBzip2},
		{"plain tar", []byte("./\x00\x00\x00"), compNone},
		{"empty", nil, compNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sniffCompression(tt.head); got != tt.want {
				t.Fatalf("sniffCompression = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	mustMkdir(t, filepath.Join(root, "usr/bin"))
	mustSymlink(t, "usr/bin", filepath.Join(root, "bin"))
	mustSymlink(t, "/usr", filepath.Join(root, "abs"))
	mustSymlink(t, "../../../..", filepath.Join(root, "usr/up"))
	mustSymlink(t, "loop2", filepath.Join(root, "loop1"))
	mustSymlink(t, "loop1", filepath.Join(root, "loop2"))
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr bool
	}{
		{"relative dir link", "/bin/bash", "usr/bin/bash", false},
		{"absolute link stays inside", "/abs/bin", "usr/bin", false},
		{"dotdot cannot escape", "/usr/up/etc/passwd", "etc/passwd", false},
		{"plain", "/etc/passwd", "etc/passwd", false},
		{"root", "/", "", false},
		{"loop", "/loop1/x", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveIn(root, tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("resolveIn(%q) = %q, want error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tt.want); got != want {
				t.Fatalf("resolveIn(%q) = %q, want %q", tt.in, got, want)
			}
		})
	}
}

func TestDetectShell(t *testing.T) {
	root := t.TempDir()
	if got := detectShell(root); got != "/bin/sh" {
		t.Fatalf("empty root: shell %q, want /bin/sh", got)
	}
	mustMkdir(t, filepath.Join(root, "usr/bin"))
	mustSymlink(t, "/usr/bin", filepath.Join(root, "bin"))
	if err := os.WriteFile(filepath.Join(root, "usr/bin/bash"), []byte("#!"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := detectShell(root); got != "/bin/bash" {
		t.Fatalf("merged-usr root with bash: shell %q, want /bin/bash", got)
	}
}

func newTestStore(t *testing.T) (*Store, *dirSnapshotter) {
	t.Helper()
	snap := newDirSnapshotter(t.TempDir())
	return &Store{Snap: snap, CacheDir: t.TempDir()}, snap
}

// assertNoBuildLeftovers fails if a temporary build volume survived.
func assertNoBuildLeftovers(t *testing.T, snap *dirSnapshotter) {
	t.Helper()
	vols, _ := snap.List(context.Background(), buildPrefix)
	if len(vols) > 0 {
		t.Fatalf("build volumes left behind: %v", vols)
	}
}

func TestBuildBusyboxLifecycle(t *testing.T) {
	if err := checkStatic(BusyboxPath); err != nil {
		t.Skipf("static busybox not installed (run make deps): %v", err)
	}
	ctx := context.Background()
	s, snap := newTestStore(t)
	var progress strings.Builder
	if err := s.Build(ctx, "busybox", &progress); err != nil {
		t.Fatal(err)
	}
	assertNoBuildLeftovers(t, snap)
	if !strings.Contains(progress.String(), "applets") {
		t.Errorf("progress %q says nothing about applets", progress.String())
	}
	in, err := s.Get(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if in.Shell != "/bin/sh" || in.Snapshot != "images/busybox" || in.Size <= 0 || in.Created.IsZero() || in.Source == "" {
		t.Errorf("unexpected info %+v", in)
	}
	for _, p := range []string{"bin/sh", "bin/ls", "usr/bin/env", "etc/passwd", "work", "var/tmp"} {
		if _, err := os.Lstat(filepath.Join(in.Path, p)); err != nil {
			t.Errorf("image lacks /%s: %v", p, err)
		}
	}
	if st, err := os.Stat(filepath.Join(in.Path, "tmp")); err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode wrong: %v %v", st.Mode(), err)
	}
	if err := s.Build(ctx, "busybox", nil); !errors.Is(err, ErrExists) {
		t.Fatalf("second build: %v, want ErrExists", err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "busybox" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if err := s.Remove(ctx, "busybox"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "busybox"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Remove: %v, want ErrNotFound", err)
	}
	if err := s.Remove(ctx, "busybox"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Remove: %v, want ErrNotFound", err)
	}
}

func TestBuildUnknownRecipe(t *testing.T) {
	s, _ := newTestStore(t)
	if err := s.Build(context.Background(), "alpine", nil); !errors.Is(err, ErrUnknownRecipe) {
		t.Fatalf("Build(alpine) = %v, want ErrUnknownRecipe", err)
	}
}

// makeTree writes a small merged-usr root with an executable bash.
func makeTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mustMkdir(t, filepath.Join(dir, "usr/bin"))
	mustMkdir(t, filepath.Join(dir, "etc"))
	mustSymlink(t, "usr/bin", filepath.Join(dir, "bin"))
	if err := os.WriteFile(filepath.Join(dir, "usr/bin/bash"), []byte("#!fake\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/os-release"), []byte("ID=test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A stale metadata file must be replaced, not trusted.
	if err := os.WriteFile(filepath.Join(dir, ".arbor-image.json"), []byte(`{"name":"other","shell":"/x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestImport(t *testing.T) {
	tree := makeTree(t)
	tarDir := t.TempDir()
	tarball := func(name string, flags ...string) string {
		p := filepath.Join(tarDir, name)
		args := append(append([]string{"-c"}, flags...), "-f", p, "-C", tree, ".")
		if out, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
			t.Fatalf("tar: %v: %s", err, out)
		}
		return p
	}
	tests := []struct {
		name string
		src  func(t *testing.T) string
	}{
		{"dir", func(*testing.T) string { return tree }},
		{"tar", func(*testing.T) string { return tarball("r.tar") }},
		{"targz", func(*testing.T) string { return tarball("r.tar.gz", "--gzip") }},
		{"tarzst", func(t *testing.T) string {
			if _, err := exec.LookPath("zstd"); err != nil {
				t.Skip("zstd not installed: run make deps")
			}
			return tarball("r.tar.zst", "--zstd")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s, snap := newTestStore(t)
			src := tt.src(t)
			if err := s.Import(ctx, "imp", src, nil); err != nil {
				t.Fatal(err)
			}
			assertNoBuildLeftovers(t, snap)
			in, err := s.Get(ctx, "imp")
			if err != nil {
				t.Fatal(err)
			}
			if in.Name != "imp" || in.Shell != "/bin/bash" || in.Source != src {
				t.Errorf("info %+v", in)
			}
			for _, p := range []string{"etc/os-release", "proc", "dev", "sys", "tmp", "work"} {
				if _, err := os.Lstat(filepath.Join(in.Path, p)); err != nil {
					t.Errorf("image lacks /%s: %v", p, err)
				}
			}
		})
	}
}

func TestImportFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.tar.gz")
	if err := os.WriteFile(bad, []byte{0x1f, 0x8b, 'n', 'o', 't', 'g', 'z'}, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		image   string
		src     string
		wantErr error
	}{
		{"corrupt tarball", "x", bad, nil},
		{"missing source", "x", filepath.Join(dir, "nope"), os.ErrNotExist},
		{"invalid name", "../x", dir, ErrInvalidName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, snap := newTestStore(t)
			err := s.Import(context.Background(), tt.image, tt.src, nil)
			if err == nil {
				t.Fatal("Import succeeded")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Import = %v, want %v", err, tt.wantErr)
			}
			vols, _ := snap.List(context.Background(), "")
			if len(vols) > 0 {
				t.Fatalf("volumes left behind: %v", vols)
			}
		})
	}
}

func TestRunReportsMissingTool(t *testing.T) {
	err := run(context.Background(), io.Discard, "arbor-no-such-tool-xyz")
	if !errors.Is(err, ErrMissingTool) {
		t.Fatalf("run = %v, want ErrMissingTool", err)
	}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// TestDebianCacheAnyCompression: the debian rootfs cache is found as .zst
// or .gz (the builder writes .gz where zstd is missing), a directory by
// that name is not a cache, and with none the path is where a build goes.
func TestDebianCacheAnyCompression(t *testing.T) {
	base := "debian-" + debianSuite + ".tar"
	want := base + ".gz"
	if _, err := exec.LookPath("zstd"); err == nil {
		want = base + ".zst"
	}
	tests := []struct {
		name    string
		files   []string // made in the cache dir
		dirs    []string
		want    string
		present bool
	}{
		{"none", nil, nil, want, false},
		{"zstd", []string{base + ".zst"}, nil, base + ".zst", true},
		{"gzip", []string{base + ".gz"}, nil, base + ".gz", true},
		{"both: zstd first", []string{base + ".gz", base + ".zst"}, nil, base + ".zst", true},
		{"a directory is not a cache", nil, []string{base + ".zst"}, want, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range tt.dirs {
				if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := (&Store{CacheDir: dir}).DebianCache()
			if got != filepath.Join(dir, tt.want) || ok != tt.present {
				t.Errorf("DebianCache() = %s, %v; want %s, %v", got, ok, filepath.Join(dir, tt.want), tt.present)
			}
		})
	}
}
