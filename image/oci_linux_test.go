package image_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/zfs/zfstest"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/image/registrytest"
)

func busyboxLayer(t *testing.T) v1.Layer { return registrytest.BusyboxLayer(t) }

// randomLayer is a layer of one file of n random bytes (incompressible).
func randomLayer(t *testing.T, path string, n int) v1.Layer {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return registrytest.Layer(t, registrytest.File{Name: path, Body: string(b)})
}

func poolUsed(t *testing.T, snap cr.Snapshotter) int64 {
	t.Helper()
	exec.Command("sync").Run()
	out, err := exec.Command("btrfs", "filesystem", "sync", snap.Path("")).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs filesystem sync: %v: %s", err, out)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(snap.Path(""), &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// TestPullSharesLayers pulls two images from a real registry that share
// a 100 MB base: the second adds only its own layer, and both run.
func TestPullSharesLayers(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	base := randomLayer(t, "opt/base.bin", 100<<20)
	a := registrytest.Image(t, v1.Config{Env: []string{"IMG=a"}}, bb, base, randomLayer(t, "opt/a", 1<<20))
	b := registrytest.Image(t, v1.Config{Env: []string{"IMG=b"}, WorkingDir: "/work/b"}, bb, base, randomLayer(t, "opt/b", 2<<20))
	da := reg.Push(t, "swe/a:1", a)
	db := reg.Push(t, "swe/b:1", b)

	var progress strings.Builder
	ina, err := s.Pull(ctx, reg.Ref("swe/a:1"), &progress)
	if err != nil {
		t.Fatal(err)
	}
	if ina.Digest != da || ina.Name != image.DigestName(da) || len(ina.Layers) != 3 {
		t.Fatalf("pulled %+v, want digest %s and 3 layers", ina, da)
	}
	if !strings.Contains(progress.String(), "layers 3/3") || !strings.Contains(progress.String(), "MB/s") {
		t.Errorf("progress %q: want layers and a rate", progress.String())
	}
	before := poolUsed(t, snap)
	inb, err := s.Pull(ctx, reg.Ref("swe/b:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	grew := poolUsed(t, snap) - before
	if inb.Digest != db {
		t.Fatalf("b: digest %s, want %s", inb.Digest, db)
	}
	// Its own layer is 2 MB; the 100 MB base must not be stored again.
	if grew > 20<<20 {
		t.Errorf("the second image grew the pool by %d MB: its shared base was stored again", grew>>20)
	}
	t.Logf("second image with a shared 100 MB base grew the pool by %.1f MB", float64(grew)/1e6)
	for i := range 2 {
		if ina.Layers[i].Chain != inb.Layers[i].Chain {
			t.Errorf("layer %d: chains %s and %s differ", i, ina.Layers[i].Chain, inb.Layers[i].Chain)
		}
	}
	if got := chroot(t, inb.Path, inb.Shell, "ls -l /opt/base.bin | awk '{print $5}'; cat /opt/b | wc -c"); got != fmt.Sprint(100<<20, "\n", 2<<20) {
		t.Errorf("b's files: %q", got)
	}
	if inb.Config == nil || inb.Config.WorkingDir != "/work/b" || !slices.Contains(inb.Config.Env, "IMG=b") {
		t.Errorf("b's config %+v", inb.Config)
	}
	// Removing a frees its own layer only; b keeps the shared ones.
	vols := func() int {
		v, err := snap.List(ctx, image.LayerPrefix)
		if err != nil {
			t.Fatal(err)
		}
		return len(v)
	}
	if n := vols(); n != 4 {
		t.Errorf("%d layer snapshots, want 4 (two shared, one each)", n)
	}
	if err := s.Remove(ctx, ina.Name); err != nil {
		t.Fatal(err)
	}
	if n := vols(); n != 3 {
		t.Errorf("%d layer snapshots after removing a, want 3", n)
	}
	if _, err := s.Resolve(ctx, reg.Ref("swe/a:1"), false, nil); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("the removed image's tag still resolves: %v", err)
	}
	if got := chroot(t, inb.Path, inb.Shell, "cat /opt/b | wc -c"); got != fmt.Sprint(2<<20) {
		t.Errorf("b after a's removal: %q", got)
	}
	if err := s.Remove(ctx, inb.Name); err != nil {
		t.Fatal(err)
	}
	if n := vols(); n != 0 {
		t.Errorf("%d layer snapshots left after removing both images", n)
	}
	assertNoBuilds(t, snap)
}

func assertNoBuilds(t *testing.T, snap cr.Snapshotter) {
	t.Helper()
	v, err := snap.List(context.Background(), "image-builds/")
	if err != nil {
		t.Fatal(err)
	}
	if len(v) > 0 {
		t.Errorf("build volumes left behind: %v", v)
	}
}

// TestPullTagMovesDigestStays: a tag resolves to what was pulled under it
// until it is pulled again; the older image stays under its digest.
func TestPullTagMovesDigestStays(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, _ := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	v1d := reg.Push(t, "task:latest", registrytest.Image(t, v1.Config{}, bb, registrytest.Layer(t, registrytest.File{Name: "v", Body: "1"})))
	in1, err := s.Resolve(ctx, reg.Ref("task:latest"), true, nil)
	if err != nil || in1.Digest != v1d {
		t.Fatalf("first resolve: %+v %v, want %s", in1, err, v1d)
	}
	v2d := reg.Push(t, "task:latest", registrytest.Image(t, v1.Config{}, bb, registrytest.Layer(t, registrytest.File{Name: "v", Body: "2"})))
	if in, err := s.Resolve(ctx, reg.Ref("task:latest"), true, nil); err != nil || in.Digest != v1d {
		t.Errorf("resolve after the tag moved: %s %v, want the pulled %s until a pull", in.Digest, err, v1d)
	}
	in2, err := s.Pull(ctx, reg.Ref("task:latest"), nil)
	if err != nil || in2.Digest != v2d {
		t.Fatalf("pull: %+v %v, want %s", in2, err, v2d)
	}
	if in, err := s.Resolve(ctx, reg.Ref("task:latest"), false, nil); err != nil || in.Digest != v2d {
		t.Errorf("resolve after the pull: %s %v, want %s", in.Digest, err, v2d)
	}
	old, err := s.Get(ctx, image.DigestName(v1d))
	if err != nil {
		t.Fatalf("the old image is gone: %v", err)
	}
	if got := chroot(t, old.Path, old.Shell, "cat /v"); got != "1" {
		t.Errorf("old image's /v = %q", got)
	}
	// By digest: no registry needed once stored.
	byDigest := reg.Host + "/task@" + v1d
	if in, err := s.Resolve(ctx, byDigest, false, nil); err != nil || in.Name != old.Name {
		t.Errorf("resolve %s: %+v %v", byDigest, in, err)
	}
}

// TestPullAuth: a registry behind htpasswd refuses a pull without
// credentials (a clear error, nothing stored) and serves one with them,
// from the store's options or from a Docker config file.
func TestPullAuth(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{Auth: true})
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	d := reg.Push(t, "private/env:1", registrytest.Image(t, v1.Config{}, bb))
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	t.Setenv("HOME", t.TempDir())

	_, err := s.Pull(ctx, reg.Ref("private/env:1"), nil)
	if !errors.Is(err, image.ErrPull) || !strings.Contains(err.Error(), "refused the credentials") {
		t.Fatalf("pull without credentials: %v, want ErrPull saying the credentials were refused", err)
	}
	s.Registry.Auth = map[string]authn.AuthConfig{reg.Host: {Username: reg.User, Password: "wrong"}}
	if _, err := s.Pull(ctx, reg.Ref("private/env:1"), nil); !errors.Is(err, image.ErrPull) {
		t.Fatalf("pull with a wrong password: %v", err)
	}
	if imgs, _ := s.List(ctx); len(imgs) != 0 {
		t.Fatalf("refused pulls stored %v", imgs)
	}
	assertNoBuilds(t, snap)

	s.Registry.Auth = map[string]authn.AuthConfig{reg.Host: {Username: reg.User, Password: reg.Password}}
	if in, err := s.Pull(ctx, reg.Ref("private/env:1"), nil); err != nil || in.Digest != d {
		t.Fatalf("pull with credentials: %+v %v", in, err)
	}
	if err := s.Remove(ctx, image.DigestName(d)); err != nil {
		t.Fatal(err)
	}

	s.Registry.Auth = nil
	auth := base64.StdEncoding.EncodeToString([]byte(reg.User + ":" + reg.Password))
	cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{reg.Host: map[string]string{"auth": auth}}})
	if err := os.WriteFile(filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if in, err := s.Pull(ctx, reg.Ref("private/env:1"), nil); err != nil || in.Digest != d {
		t.Fatalf("pull with the Docker config's credentials: %+v %v", in, err)
	}
}

// TestPullBadInput: every failure is a clear error and leaves nothing
// half-made: no image, no layer snapshot of the failed layer, no build
// volume.
func TestPullBadInput(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	s.Registry.Attempts = 1

	corrupt := randomLayer(t, "c", 1<<20)
	reg.Push(t, "bad/corrupt:1", registrytest.Image(t, v1.Config{}, bb, corrupt))
	cd, _ := corrupt.Digest()
	// Flip bytes in the stored blob: the registry serves it as it is.
	f, err := os.OpenFile(reg.BlobPath(cd.String()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("garbage!"), 4096)
	f.Close()

	trunc := randomLayer(t, "t", 1<<20)
	reg.Push(t, "bad/truncated:1", registrytest.Image(t, v1.Config{}, bb, trunc))
	td, _ := trunc.Digest()
	if err := os.Truncate(reg.BlobPath(td.String()), 1000); err != nil {
		t.Fatal(err)
	}

	dev := registrytest.Layer(t, registrytest.File{Name: "opt/", Type: tar.TypeDir}, registrytest.File{Name: "opt/kmem", Type: tar.TypeChar})
	reg.Push(t, "bad/device:1", registrytest.Image(t, v1.Config{}, bb, dev))
	reg.Push(t, "bad/noshell:1", registrytest.Image(t, v1.Config{}, registrytest.Layer(t, registrytest.File{Name: "hello", Body: "x"})))
	reg.Push(t, "bad/nouser:1", registrytest.Image(t, v1.Config{User: "ghost"}, bb))

	tests := []struct {
		name, ref string
		want      error
		says      string
	}{
		{"missing tag", reg.Ref("bad/corrupt:nope"), image.ErrPull, "no such repository, tag or digest"},
		{"missing repository", reg.Ref("nobody/here:1"), image.ErrPull, "no such repository"},
		{"digest that is not there", reg.Host + "/bad/corrupt@sha256:" + strings.Repeat("ab", 32), image.ErrPull, "no such"},
		{"refused connection", "127.0.0.1:1/x/y:1", image.ErrPull, "connect"},
		{"invalid reference", reg.Host + "/UPPER/case:1", image.ErrInvalidName, ""},
		{"corrupt layer", reg.Ref("bad/corrupt:1"), image.ErrBadLayer, ""},
		{"truncated layer", reg.Ref("bad/truncated:1"), nil, "layer 2 of 2"},
		{"device node", reg.Ref("bad/device:1"), image.ErrBadLayer, "device node"},
		{"no shell", reg.Ref("bad/noshell:1"), image.ErrNoShell, "/bin/sh"},
		{"unknown user", reg.Ref("bad/nouser:1"), nil, `user "ghost" is not in the image's /etc/passwd`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Pull(ctx, tt.ref, nil)
			if err == nil {
				t.Fatal("pulled")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("err %q does not say %q", err, tt.says)
			}
			if imgs, _ := s.List(ctx); len(imgs) != 0 {
				t.Errorf("images after a failed pull: %v", imgs)
			}
			assertNoBuilds(t, snap)
		})
	}
	// Valid layers stay stored (the next pull reuses them; image rm and
	// PruneLayers free them), layers that failed never are.
	bbd, _ := bb.DiffID()
	vols, _ := snap.List(ctx, image.LayerPrefix)
	for _, l := range []v1.Layer{corrupt, trunc, dev} {
		d, _ := l.DiffID()
		sum := sha256.Sum256([]byte(bbd.String() + " " + d.String()))
		bad := image.LayerSnapshot("sha256:" + hex.EncodeToString(sum[:]))
		if slices.ContainsFunc(vols, func(v cr.Volume) bool { return v.Name == bad }) {
			t.Errorf("the failed layer %s was stored", bad)
		}
	}
	if n, err := s.PruneLayers(ctx); err != nil || n != len(vols) {
		t.Errorf("prune: %d, %v; want the %d layers no image uses", n, err, len(vols))
	}
}

// TestPullManyLayers: a 50-layer image pulls, and its top sees every
// layer's file.
func TestPullManyLayers(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, _ := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	ls := []v1.Layer{busyboxLayer(t)}
	for i := range 49 {
		ls = append(ls, registrytest.Layer(t, registrytest.File{Name: fmt.Sprintf("l/%02d", i), Body: fmt.Sprint(i)}))
	}
	reg.Push(t, "many:1", registrytest.Image(t, v1.Config{}, ls...))
	in, err := s.Pull(ctx, reg.Ref("many:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Layers) != 50 {
		t.Errorf("%d layers", len(in.Layers))
	}
	if got := chroot(t, in.Path, in.Shell, "ls /l | wc -l; cat /l/48"); got != "49\n48" {
		t.Errorf("top of 50 layers: %q", got)
	}
}

// TestImportArchives: a docker save archive, an OCI layout directory and
// a tar of one import as images whose layers are stored once.
func TestImportArchives(t *testing.T) {
	s, snap := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	img := registrytest.Image(t, v1.Config{Env: []string{"FROM=archive"}}, bb, registrytest.Layer(t, registrytest.File{Name: "marker", Body: "archived"}))
	dir := t.TempDir()

	docker := filepath.Join(dir, "docker.tar")
	tag, _ := name.NewTag("example.test/arch:1")
	if err := tarball.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "layout")
	lp, err := layout.Write(oci, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "layout.tar")
	if out, err := exec.Command("tar", "-c", "-f", ociTar, "-C", oci, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	want, _ := img.Digest()
	for _, c := range []struct{ name, src string }{{"from-docker", docker}, {"from-layout", oci}, {"from-layout-tar", ociTar}} {
		if err := s.Import(ctx, c.name, c.src, nil); err != nil {
			t.Fatalf("import %s: %v", c.src, err)
		}
		in, err := s.Get(ctx, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if in.Digest != want.String() || len(in.Layers) != 2 || in.Config == nil || !slices.Contains(in.Config.Env, "FROM=archive") {
			t.Errorf("%s: %+v", c.name, in)
		}
		if got := chroot(t, in.Path, in.Shell, "cat /marker"); got != "archived" {
			t.Errorf("%s: /marker = %q", c.name, got)
		}
	}
	vols, _ := snap.List(ctx, image.LayerPrefix)
	if len(vols) != 2 {
		t.Errorf("%d layer snapshots for three imports of one image, want 2", len(vols))
	}
}

// TestImageUser: the config's user resolves in the image's passwd and
// group files; the image records uid, gid, groups and HOME.
func TestImageUser(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, _ := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	etc := registrytest.Layer(t,
		registrytest.File{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"},
		registrytest.File{Name: "etc/group", Body: "root:x:0:\napp:x:1000:\nstaff:x:50:app\ndocker:x:999:other,app\n"})
	for _, c := range []struct {
		user     string
		uid, gid uint32
		groups   []uint32
		home     string
	}{
		{"app", 1000, 1000, []uint32{50, 999}, "HOME=/home/app"},
		{"app:staff", 1000, 50, []uint32{999}, "HOME=/home/app"},
		{"1234:5", 1234, 5, nil, ""},
		{"1000", 1000, 1000, []uint32{50, 999}, "HOME=/home/app"},
	} {
		tag := "user:" + strings.NewReplacer(":", "-").Replace(c.user)
		reg.Push(t, tag, registrytest.Image(t, v1.Config{User: c.user}, bb, etc))
		in, err := s.Pull(ctx, reg.Ref(tag), nil)
		if err != nil {
			t.Fatal(err)
		}
		cf := in.Config
		if cf.UID != c.uid || cf.GID != c.gid || !slices.Equal(cf.Groups, c.groups) || (c.home != "" && !slices.Contains(cf.Env, c.home)) {
			t.Errorf("user %q: %+v, want %d:%d %v %s", c.user, cf, c.uid, c.gid, c.groups, c.home)
		}
	}
}

// TestPullInterrupted: a pull cut off mid-layer (its context ended)
// leaves no build volume and no image; one whose process died (its build
// volume left behind) is cleaned by the next pull; the next pull reuses
// the layers that were done and completes.
func TestPullInterrupted(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, snap := btrfsStore(t, t.TempDir())
	bb := busyboxLayer(t)
	big := randomLayer(t, "big", 64<<20)
	reg.Push(t, "slow:1", registrytest.Image(t, v1.Config{}, bb, big))
	ref := reg.Ref("slow:1")

	// A dead process's build volume: a pull killed mid-layer.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("image-builds/%d-layer-0000", dead.Process.Pid)
	if err := snap.CreateVolume(context.Background(), stale); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	w := &cancelAfter{cancel: cancel, after: "layers 1/2"}
	if _, err := s.Pull(ctx, ref, w); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted pull: %v, want context.Canceled", err)
	}
	assertNoBuilds(t, snap)
	if imgs, _ := s.List(context.Background()); len(imgs) != 0 {
		t.Fatalf("an interrupted pull left images %v", imgs)
	}
	var progress strings.Builder
	in, err := s.Pull(context.Background(), ref, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "layer 1/2 already stored") {
		t.Errorf("the second pull did not reuse the first layer: %q", progress.String())
	}
	if got := chroot(t, in.Path, in.Shell, "wc -c < /big"); got != fmt.Sprint(64<<20) {
		t.Errorf("/big: %q", got)
	}
	assertNoBuilds(t, snap)
}

// cancelAfter cancels once the progress says after.
type cancelAfter struct {
	cancel func()
	after  string
	seen   strings.Builder
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.seen.Write(p)
	if strings.Contains(c.seen.String(), c.after) {
		c.cancel()
	}
	return len(p), nil
}

// TestPullFullDisk: a layer larger than the pool fails with ENOSPC, leaves
// nothing half-made, and the pool takes a small image afterwards.
func TestPullFullDisk(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	if os.Geteuid() != 0 {
		t.Skip("needs root (btrfs pool)")
	}
	snap, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: t.TempDir(), PoolSize: 160 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snap.Unmount(context.Background()) })
	s := &image.Store{Snap: snap, CacheDir: t.TempDir()}
	ctx := context.Background()
	bb := busyboxLayer(t)
	// Zeros: a few hundred KB compressed, 240 MB on disk.
	zeros := registrytest.Layer(t, registrytest.File{Name: "zeros", Body: strings.Repeat("\x00", 240<<20)})
	reg.Push(t, "huge:1", registrytest.Image(t, v1.Config{}, bb, zeros))
	_, err = s.Pull(ctx, reg.Ref("huge:1"), nil)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("pull onto a full pool: %v, want ENOSPC", err)
	}
	assertNoBuilds(t, snap)
	if imgs, _ := s.List(ctx); len(imgs) != 0 {
		t.Fatalf("images after a failed pull: %v", imgs)
	}
	// btrfs gives a destroyed volume's room back in the background.
	if err := snap.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "small:1", registrytest.Image(t, v1.Config{}, bb))
	if _, err := s.Pull(ctx, reg.Ref("small:1"), nil); err != nil {
		t.Fatalf("a small pull after the full disk: %v", err)
	}
}

// TestPullLayersZFS: on the zfs backend too, two images that share a base
// store it once (each layer a clone of the one below), run, and are
// removed with the layers they alone use (zfs destroys a snapshot with
// clones by promoting them).
func TestPullLayersZFS(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	snap := zfstest.NewRoot(t)
	s := &image.Store{Snap: snap, CacheDir: t.TempDir()}
	ctx := context.Background()
	bb := busyboxLayer(t)
	base := randomLayer(t, "opt/base.bin", 8<<20)
	reg.Push(t, "z/a:1", registrytest.Image(t, v1.Config{}, bb, base, registrytest.Layer(t, registrytest.File{Name: "who", Body: "a"})))
	reg.Push(t, "z/b:1", registrytest.Image(t, v1.Config{}, bb, base, registrytest.Layer(t, registrytest.File{Name: "who", Body: "b"})))
	ina, err := s.Pull(ctx, reg.Ref("z/a:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	inb, err := s.Pull(ctx, reg.Ref("z/b:1"), &progress)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "layer 2/3 already stored") {
		t.Errorf("b's pull did not reuse the shared base: %q", progress.String())
	}
	layers := func() int {
		v, err := snap.List(ctx, image.LayerPrefix)
		if err != nil {
			t.Fatal(err)
		}
		return len(v)
	}
	if n := layers(); n != 4 {
		t.Errorf("%d layer snapshots, want 4", n)
	}
	for _, c := range []struct {
		in   image.Info
		want string
	}{{ina, "a"}, {inb, "b"}} {
		if got := chroot(t, c.in.Path, c.in.Shell, "cat /who; echo; wc -c < /opt/base.bin"); got != c.want+"\n"+fmt.Sprint(8<<20) {
			t.Errorf("%s: %q", c.in.Name, got)
		}
	}
	if err := s.Remove(ctx, ina.Name); err != nil {
		t.Fatal(err)
	}
	if n := layers(); n != 3 {
		t.Errorf("%d layer snapshots after removing a, want 3", n)
	}
	if got := chroot(t, inb.Path, inb.Shell, "cat /who"); got != "b" {
		t.Errorf("b after a's removal: %q", got)
	}
	if err := s.Remove(ctx, inb.Name); err != nil {
		t.Fatal(err)
	}
	if n := layers(); n != 0 {
		t.Errorf("%d layer snapshots after removing both", n)
	}
	assertNoBuilds(t, snap)
}

// TestPullPlatform: from a multi-platform index the linux image of this
// machine's architecture is pulled; an index without one is a clear
// error.
func TestPullPlatform(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, _ := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	mine := registrytest.Image(t, v1.Config{}, bb, registrytest.Layer(t, registrytest.File{Name: "arch", Body: runtime.GOARCH}))
	other := registrytest.Image(t, v1.Config{}, bb, registrytest.Layer(t, registrytest.File{Name: "arch", Body: "riscv64"}))
	otherArch := &v1.Platform{OS: "linux", Architecture: "riscv64"}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: otherArch}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
	only := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: otherArch}})
	for tag, ix := range map[string]v1.ImageIndex{"multi:1": idx, "foreign:1": only} {
		ref, err := name.ParseReference(reg.Ref(tag))
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.WriteIndex(ref, ix); err != nil {
			t.Fatal(err)
		}
	}
	in, err := s.Pull(ctx, reg.Ref("multi:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := mine.Digest()
	if in.Digest != want.String() {
		t.Errorf("pulled %s, want the %s image %s", in.Digest, runtime.GOARCH, want)
	}
	if got := chroot(t, in.Path, in.Shell, "cat /arch"); got != runtime.GOARCH {
		t.Errorf("/arch = %q", got)
	}
	_, err = s.Pull(ctx, reg.Ref("foreign:1"), nil)
	if !errors.Is(err, image.ErrPull) || !strings.Contains(err.Error(), "linux/"+runtime.GOARCH) {
		t.Errorf("an index without this platform: %v, want ErrPull naming linux/%s", err, runtime.GOARCH)
	}
	t.Logf("an index without linux/%s: %v", runtime.GOARCH, err)
}

// TestPullFromAllowList: a client's reset (Resolve) pulls only from the
// registries Registry.PullFrom names (a hostile client could otherwise
// make the server fetch from any host, loopback services included); the
// operator's Pull is not limited, and what it stored resolves.
func TestPullFromAllowList(t *testing.T) {
	reg := registrytest.Start(t, registrytest.Options{})
	s, _ := btrfsStore(t, t.TempDir())
	ctx := context.Background()
	bb := busyboxLayer(t)
	reg.Push(t, "allow/a:1", registrytest.Image(t, v1.Config{}, bb))
	reg.Push(t, "allow/b:1", registrytest.Image(t, v1.Config{Env: []string{"B=1"}}, bb))
	for _, from := range [][]string{{"registry.example:5000"}, {}} {
		s.Registry.PullFrom = from
		_, err := s.Resolve(ctx, reg.Ref("allow/a:1"), true, nil)
		if !errors.Is(err, image.ErrNotFound) || !strings.Contains(err.Error(), "--pull-from") || !strings.Contains(err.Error(), reg.Host) {
			t.Errorf("pull-from %q: resolve of %s: %v, want ErrNotFound naming --pull-from and the host", from, reg.Ref("allow/a:1"), err)
		}
		if imgs, _ := s.List(ctx); len(imgs) != 0 {
			t.Fatalf("pull-from %q: a refused pull stored %v", from, imgs)
		}
	}
	in, err := s.Pull(ctx, reg.Ref("allow/a:1"), nil)
	if err != nil {
		t.Fatalf("the operator's pull: %v", err)
	}
	if got, err := s.Resolve(ctx, reg.Ref("allow/a:1"), true, nil); err != nil || got.Name != in.Name {
		t.Errorf("resolve of what the operator pulled: %+v %v", got, err)
	}
	s.Registry.PullFrom = []string{reg.Host}
	if _, err := s.Resolve(ctx, reg.Ref("allow/b:1"), true, nil); err != nil {
		t.Errorf("resolve from an allowed registry: %v", err)
	}
}
