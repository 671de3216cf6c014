package image_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/image/registrytest"
)

func layerNames(t *testing.T, snap cr.Snapshotter) []string {
	t.Helper()
	vols, err := snap.List(context.Background(), image.LayerPrefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out
}

const busyboxRecipe = `
base: busybox
files:
  - {src: files/hello.txt, dst: /opt/hello.txt, mode: "0600"}
  - {src: files/tool.sh, dst: /usr/local/bin/, mode: 0755}
  - {src: tree, dst: /srv/tree}
run:
  - echo built > /etc/motd
  - 'echo "$GREETING from $(pwd)" > greeting; cat /opt/hello.txt > copy; echo step-output-marker'
  - echo 'app:x:1000:1000:app:/home/app:/bin/sh' >> /etc/passwd; echo 'app:x:1000:' >> /etc/group
env: ["GREETING=hi", "LANG=C.UTF-8"]
workdir: /app
user: app
`

// TestRecipeBusybox builds a recipe on busybox: its files, run output,
// config, one layer on top of the base; built once; a changed file
// rebuilds and replaces it; removing it frees its layer.
func TestRecipeBusybox(t *testing.T) {
	requireStaticBusybox(t)
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	dir := t.TempDir()
	p := writeRecipe(t, dir, busyboxRecipe, map[string]string{
		"files/hello.txt": "hello v1\n",
		"files/tool.sh":   "#!/bin/sh\necho tool ran\n",
		"tree/a":          "a\n",
		"tree/sub/b":      "b\n",
	})
	if err := os.Symlink("a", filepath.Join(dir, "tree/link")); err != nil {
		t.Fatal(err)
	}
	var progress registrytest.SyncBuffer
	start := time.Now()
	in, err := s.BuildRecipe(ctx, "bb-recipe", p, &progress)
	if err != nil {
		t.Fatalf("BuildRecipe: %v\n%s", err, progress.String())
	}
	t.Logf("recipe image on busybox (with busybox itself) built in %s", time.Since(start))
	if !strings.Contains(progress.String(), "step-output-marker") {
		t.Errorf("run output missing from progress:\n%s", progress.String())
	}
	tests := []struct {
		name   string
		script string
		want   string
	}{
		{"file", "cat /opt/hello.txt", "hello v1"},
		{"file mode and owner", "stat -c '%a %u:%g' /opt/hello.txt", "600 0:0"},
		{"into a directory, unquoted octal mode", "stat -c %a /usr/local/bin/tool.sh; tool.sh", "755\ntool ran"},
		{"tree", "cat /srv/tree/a /srv/tree/sub/b; readlink /srv/tree/link", "a\nb\na"},
		{"run", "cat /etc/motd", "built"},
		{"run env and workdir", "cat /app/greeting /app/copy", "hi from /app\nhello v1"},
		{"workdir owned by the user", "stat -c %u:%g /app", "1000:1000"},
		{"no proc or dev left mounted", "find /proc /dev -mindepth 1 | wc -l", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chroot(t, in.Path, in.Shell, tt.script); got != tt.want {
				t.Fatalf("%q printed %q, want %q", tt.script, got, tt.want)
			}
		})
	}
	c := in.Config
	if c == nil || c.WorkingDir != "/app" || c.User != "app" || c.UID != 1000 || c.GID != 1000 ||
		!slices.Contains(c.Env, "GREETING=hi") || !slices.Contains(c.Env, "HOME=/home/app") {
		t.Errorf("config %+v, want env GREETING and HOME, workdir /app, user app 1000:1000", c)
	}
	if len(in.Layers) != 1 || in.Recipe == "" || in.Layers[0].DiffID != "sha256:"+in.Recipe || in.Layers[0].Unpacked <= 0 {
		t.Fatalf("layers %+v recipe %q, want one layer of the recipe's key with bytes", in.Layers, in.Recipe)
	}
	if !strings.Contains(in.Source, p) {
		t.Errorf("source %q does not name the recipe", in.Source)
	}
	layer := image.LayerSnapshot(in.Layers[0].Chain)
	if got := layerNames(t, snap); !slices.Equal(got, []string{layer}) {
		t.Errorf("layer snapshots %v, want [%s]", got, layer)
	}
	if _, err := os.Stat(filepath.Join(snap.Path(layer), image.MetadataPath)); !os.IsNotExist(err) {
		t.Errorf("the layer carries the base's metadata file: %v", err)
	}
	assertNoBuilds(t, snap)

	// Built once: the same recipe, files and base return the image made.
	again, err := s.BuildRecipe(ctx, "bb-recipe", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Created.Equal(in.Created) || again.Recipe != in.Recipe || !slices.Equal(layerNames(t, snap), []string{layer}) {
		t.Errorf("second build made something: %v %s, layers %v", again.Created, again.Recipe, layerNames(t, snap))
	}

	// A changed file is another key: the image is rebuilt and replaces
	// the old one, whose layer goes.
	if err := os.WriteFile(filepath.Join(dir, "files/hello.txt"), []byte("hello v2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v2, err := s.BuildRecipe(ctx, "bb-recipe", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Recipe == in.Recipe {
		t.Fatal("a changed file kept the recipe key")
	}
	if got := chroot(t, v2.Path, v2.Shell, "cat /opt/hello.txt /app/copy"); got != "hello v2\nhello v2" {
		t.Errorf("rebuilt image has %q", got)
	}
	if got := layerNames(t, snap); !slices.Equal(got, []string{image.LayerSnapshot(v2.Layers[0].Chain)}) {
		t.Errorf("layers after the rebuild %v, want only the new one", got)
	}
	// So is a changed mode.
	if err := os.Chmod(filepath.Join(dir, "tree/a"), 0o600); err != nil {
		t.Fatal(err)
	}
	v3, err := s.BuildRecipe(ctx, "bb-recipe", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v3.Recipe == v2.Recipe {
		t.Error("a changed mode kept the recipe key")
	}
	if got := chroot(t, v3.Path, v3.Shell, "stat -c %a /srv/tree/a"); got != "600" {
		t.Errorf("mode after the rebuild %q", got)
	}

	// A recipe image on a recipe image: a second layer on the first.
	p2 := writeRecipe(t, t.TempDir(), "base: bb-recipe\nrun: [\"echo two > /two\"]\n", nil)
	top, err := s.BuildRecipe(ctx, "bb-recipe-2", p2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Layers) != 2 || top.Layers[0] != v3.Layers[0] || top.Config.UID != 1000 {
		t.Errorf("stacked recipe image: layers %+v config %+v", top.Layers, top.Config)
	}
	if got := chroot(t, top.Path, top.Shell, "cat /two /opt/hello.txt"); got != "two\nhello v2" {
		t.Errorf("stacked image has %q", got)
	}

	// An image that was not made by a recipe is not replaced.
	if err := s.Import(ctx, "plain", filepath.Join(dir, "tree"), nil); err == nil {
		t.Fatal("importing a tree without a shell worked")
	}
	bb, err := s.Get(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Import(ctx, "plain", bb.Path, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BuildRecipe(ctx, "plain", p, nil); !errors.Is(err, image.ErrExists) {
		t.Errorf("building over an imported image: %v, want ErrExists", err)
	}

	for _, n := range []string{"bb-recipe-2", "bb-recipe"} {
		if err := s.Remove(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if got := layerNames(t, snap); len(got) != 0 {
		t.Errorf("layers left after removing the recipe images: %v", got)
	}
	assertNoBuilds(t, snap)
}

// TestRecipeBad: a recipe that cannot be built fails with a clear error
// and leaves no image, no layer and no build volume; a failed rebuild
// keeps the image it would have replaced.
func TestRecipeBad(t *testing.T) {
	requireStaticBusybox(t)
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	if err := s.Build(ctx, "busybox", nil); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"x": "x\n"}
	tests := []struct {
		name    string
		recipe  string
		want    error
		message string
	}{
		{"unknown field", "base: busybox\nrun: [\"true\"]\nrunn: [\"true\"]\n", image.ErrBadRecipe, "field runn not found"},
		{"relative dst", "base: busybox\nfiles: [{src: x, dst: x}]\n", image.ErrBadRecipe, "not absolute"},
		{"missing src", "base: busybox\nfiles: [{src: nothere, dst: /x}]\n", image.ErrBadRecipe, "nothere"},
		{"failing run step", "base: busybox\nrun: [\"echo ok\", \"echo some output; echo to stderr >&2; exit 3\"]\n",
			image.ErrRecipeStep, `run[1] "echo some output; echo to stderr >&2; exit 3": recipe step failed: exit code 3: some output` + "\nto stderr"},
		{"run step timeout", "base: busybox\ntimeout: 1s\nrun: [\"sleep 30\"]\n", image.ErrRecipeStep, "timed out after 1s"},
		{"nonexistent base", "base: nosuchimage\nrun: [\"true\"]\n", image.ErrNotFound, "base nosuchimage"},
		{"user not in the image", "base: busybox\nuser: nobody2\nrun: [\"true\"]\n", image.ErrBadRecipe, `user "nobody2" is not in the image's /etc/passwd`},
		{"packages on a base without apt", "base: busybox\npackages: [hello]\n", image.ErrBadRecipe, "packages need a Debian base with apt-get"},
		{"file over a directory", "base: busybox\nfiles: [{src: x, dst: /etc/x}, {src: d, dst: /etc/x}]\n", nil, "files[1] d -> /etc/x: /etc/x is not a directory"},
	}
	files["d/x/y"] = "y" // copying d into /etc puts directory x where the file is
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeRecipe(t, "", tt.recipe, files)
			start := time.Now()
			_, err := s.BuildRecipe(ctx, "bad", p, nil)
			t.Logf("failed in %s: %v", time.Since(start).Round(time.Millisecond), err)
			if err == nil {
				t.Fatal("BuildRecipe worked")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("error %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("error %q does not say %q", err, tt.message)
			}
			if _, err := s.Get(ctx, "bad"); !errors.Is(err, image.ErrNotFound) {
				t.Errorf("image after a failed build: %v", err)
			}
			if got := layerNames(t, snap); len(got) != 0 {
				t.Errorf("layers after a failed build: %v", got)
			}
			assertNoBuilds(t, snap)
		})
	}

	t.Run("failed rebuild keeps the image", func(t *testing.T) {
		dir := t.TempDir()
		p := writeRecipe(t, dir, "base: busybox\nrun: [\"echo 1 > /v\"]\n", nil)
		old, err := s.BuildRecipe(ctx, "kept", p, nil)
		if err != nil {
			t.Fatal(err)
		}
		writeRecipe(t, dir, "base: busybox\nrun: [\"echo 2 > /v; false\"]\n", nil)
		if _, err := s.BuildRecipe(ctx, "kept", p, nil); !errors.Is(err, image.ErrRecipeStep) {
			t.Fatalf("failing rebuild: %v", err)
		}
		in, err := s.Get(ctx, "kept")
		if err != nil || in.Recipe != old.Recipe {
			t.Fatalf("image after a failed rebuild: %+v %v", in, err)
		}
		if got := chroot(t, in.Path, in.Shell, "cat /v"); got != "1" {
			t.Errorf("kept image has %q", got)
		}
		if got := layerNames(t, snap); !slices.Equal(got, []string{image.LayerSnapshot(old.Layers[0].Chain)}) {
			t.Errorf("layers %v", got)
		}
		assertNoBuilds(t, snap)
	})
}

// TestRecipeDebianPackages installs a package from the host's apt source
// on the debian image (built from the shared rootfs cache, which make
// test-images fills) and runs it.
func TestRecipeDebianPackages(t *testing.T) {
	cacheDir := image.DefaultCacheDir
	if d := os.Getenv("ARBOR_IMAGE_CACHE"); d != "" {
		cacheDir = d
	}
	if _, ok := (&image.Store{CacheDir: cacheDir}).DebianCache(); !ok {
		t.Fatalf("no cached debian rootfs in %s: run make test-images (bin/arbor image build --cache-only debian)", cacheDir)
	}
	s, snap := btrfsStore(t, cacheDir)
	ctx := context.Background()
	start := time.Now()
	if err := s.Build(ctx, "debian", nil); err != nil {
		t.Fatal(err)
	}
	deb, err := s.Get(ctx, "debian")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("debian image built from the cache in %s", time.Since(start).Round(time.Millisecond))
	p := writeRecipe(t, "", `
base: debian
packages: [hello, tree]
files: [{src: greet.sh, dst: /usr/local/bin/greet, mode: "0755"}]
run: ["hello --greeting=built > /built.txt", "greet > /greet.txt"]
`, map[string]string{"greet.sh": "#!/bin/sh\nexec hello --greeting=\"$(tree --version | cut -d' ' -f1)\"\n"})
	var progress registrytest.SyncBuffer
	start = time.Now()
	in, err := s.BuildRecipe(ctx, "deb-hello", p, &progress)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("BuildRecipe: %v\n%s", err, progress.String())
	}
	t.Logf("packages hello and tree installed, image built in %s", took.Round(time.Millisecond))
	for _, l := range strings.Split(progress.String(), "\n") {
		if strings.HasPrefix(l, "recipe ") || strings.HasPrefix(l, "packages:") {
			t.Log(l)
		}
	}
	tests := []struct {
		name   string
		script string
		want   string
	}{
		{"hello runs", "hello", "Hello, world!"},
		{"dpkg knows it", "dpkg-query -W -f '${Status}' hello", "install ok installed"},
		{"run step used the package", "cat /built.txt", "built"},
		{"file uses both packages", "cat /greet.txt", "tree"},
		{"no package lists", "ls /var/lib/apt/lists | grep -c _ || true", "0"},
		{"no .debs", "ls /var/cache/apt/archives | grep -c deb || true", "0"},
		{"no build apt config", "test -e /tmp/.arbor-recipe-apt || echo gone", "gone"},
		{"no policy-rc.d", "test -e /usr/sbin/policy-rc.d || echo gone", "gone"},
		{"image's own sources untouched", "cat /etc/apt/sources.list", chroot(t, deb.Path, deb.Shell, "cat /etc/apt/sources.list")},
		{"resolv.conf untouched", "cat /etc/resolv.conf", chroot(t, deb.Path, deb.Shell, "cat /etc/resolv.conf")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chroot(t, in.Path, in.Shell, tt.script); got != tt.want {
				t.Fatalf("%q printed %q, want %q", tt.script, got, tt.want)
			}
		})
	}
	if len(in.Layers) != 1 || in.Layers[0].Unpacked < 10<<10 || in.Layers[0].Unpacked > 50<<20 {
		t.Errorf("layers %+v, want one of the packages' size", in.Layers)
	}
	t.Logf("debian %d bytes, the recipe's layer adds %d", deb.Size, in.Layers[0].Unpacked)
	assertNoBuilds(t, snap)

	start = time.Now()
	again, err := s.BuildRecipe(ctx, "deb-hello", p, nil)
	if err != nil || !again.Created.Equal(in.Created) {
		t.Fatalf("second build: %v %v", again.Created, err)
	}
	t.Logf("up to date in %s", time.Since(start).Round(time.Millisecond))

	// A package the source does not have: apt-get's error, and nothing
	// left, the shared .deb cache included (it is unmounted before the
	// build root is tidied).
	bad := writeRecipe(t, "", "base: debian\npackages: [hello, no-such-package-arbor]\n", nil)
	_, err = s.BuildRecipe(ctx, "deb-bad", bad, nil)
	if !errors.Is(err, image.ErrRecipeStep) || !strings.Contains(err.Error(), "Unable to locate package no-such-package-arbor") {
		t.Errorf("unknown package: %v, want ErrRecipeStep with apt-get's message", err)
	}
	if _, err := s.Get(ctx, "deb-bad"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("image after a failed build: %v", err)
	}
	assertNoBuilds(t, snap)
	debs, _ := filepath.Glob(filepath.Join(cacheDir, "debs-bookworm", "hello_*.deb"))
	if len(debs) != 1 {
		t.Errorf("hello's .deb in the build cache: %v, want it kept", debs)
	}
}
