package criu_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/initd"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// idmapMount mounts src at dst idmapped by u's range.
func idmapMount(t *testing.T, src, dst string, u sandbox.UserNSConfig) {
	t.Helper()
	cmd := exec.Command("sleep", "100")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.HostID), Size: int(u.Size)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	start := time.Now()
	defer func() {
		t.Logf("idmapped mount of %s: %v (without making the user namespace)", filepath.Base(src), time.Since(start))
	}()
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatalf("open_tree: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}); err != nil {
		t.Fatalf("mount_setattr idmap: %v", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatalf("move_mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
}

// TestIdmappedRootRestores documents the alternative to shifted images
// that was measured and not chosen (docs/sandbox.md, "User namespace
// mode"): an idmapped mount of an unshifted clone as the root of a sandbox
// in user namespace mode. CRIU 4.2.1 dumps it and restores it onto an
// idmapped mount of the child's clone: ids inside are 0, files on the clone
// stay owned by host root.
func TestIdmappedRootRestores(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	u := sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	if err := snap.CreateVolume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	root := sandboxtest.BusyboxRoot(t, "")
	if out, err := exec.Command("cp", "-a", root+"/.", snap.Path("src")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	// What the host writes, it writes on the raw clone: through the
	// idmapped mount host root is unmapped and may not create files.
	init := sandboxtest.InitBinary(t)
	if err := os.MkdirAll(filepath.Join(snap.Path("src"), ".arbor"), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", init, filepath.Join(snap.Path("src"), ".arbor", "init")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := initd.PrepareDev(snap.Path("src")); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt-src")
	idmapMount(t, snap.Path("src"), mnt, u)
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "idsrc", Root: mnt, InitBinary: init, UserNS: u})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	want := fmt.Sprintf("0 %d %d\n0 0\n", u.HostID, u.Size)
	probe := func(sb *sandbox.Sandbox, name string) {
		t.Helper()
		r, err := sb.Exec(ctx, "cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'; touch /tmp/"+name+"; stat -c '%u %g' /tmp/"+name, sandbox.ExecOptions{})
		if err != nil || string(r.Stdout) != want {
			t.Fatalf("%s: %v %q %q, want %q", name, err, r.Stdout, r.Stderr, want)
		}
	}
	rawOwner := func(vol, name string) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(snap.Path(vol), "tmp", name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s on the raw clone: %d:%d, want 0:0", name, st.Uid, st.Gid)
		}
	}
	probe(sb, "x")
	rawOwner("src", "x")
	imgs := t.TempDir()
	_, rec := dump(t, c, snap, sb, "snap1", imgs, true)
	if err := snap.Clone(ctx, "snap1", "child"); err != nil {
		t.Fatal(err)
	}
	cm := filepath.Join(t.TempDir(), "mnt-child")
	idmapMount(t, snap.Path("child"), cm, u)
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: "idchild", Root: cm, UserNS: u}, rec, func(join func(int) error) (int, error) {
		return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: cm, Join: join, UserNS: true})
	})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	defer child.Destroy(ctx)
	probe(child, "y")
	rawOwner("child", "y")
}
