package criu_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
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

// TestIdmapSpike: the alternative to shifted images, an idmapped mount of
// an unshifted clone as the root of a sandbox in user namespace mode.
func TestIdmapSpike(t *testing.T) {
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
	// What the host writes, it writes on the raw clone (through the
	// idmapped mount host root is unmapped and may not create files).
	init := sandboxtest.InitBinary(t)
	os.MkdirAll(filepath.Join(snap.Path("src"), ".arbor"), 0o700)
	if out, err := exec.Command("cp", init, filepath.Join(snap.Path("src"), ".arbor", "init")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := initdPrepareDev(snap.Path("src")); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt-src")
	idmapMount(t, snap.Path("src"), mnt, u)
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "idsrc", Root: mnt, InitBinary: init, UserNS: u})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	r, err := sb.Exec(ctx, "cat /proc/self/uid_map; touch /tmp/x; ls -ln /tmp/x", sandbox.ExecOptions{})
	t.Logf("src: %v %q %q", err, r.Stdout, r.Stderr)
	var st syscall.Stat_t
	syscall.Stat(filepath.Join(snap.Path("src"), "tmp", "x"), &st)
	t.Logf("on the raw clone: %d:%d", st.Uid, st.Gid)
	imgs := t.TempDir()
	err = sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		if err := snap.Snapshot(ctx, "src", "snap1"); err != nil {
			return err
		}
		_, err = c.Dump(ctx, criu.DumpRequest{PID: sb.InitPID(), Dir: imgs, FreezeCgroup: sb.FreezerCgroup(), UserNS: true})
		return err
	})
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	if err := snap.Clone(ctx, "snap1", "child"); err != nil {
		t.Fatal(err)
	}
	cm := filepath.Join(t.TempDir(), "mnt-child")
	idmapMount(t, snap.Path("child"), cm, u)
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: "idchild", Root: cm, UserNS: u}, func(join func(int) error) (int, error) {
		return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: cm, Join: join, UserNS: true})
	})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	defer child.Destroy(ctx)
	r, err = child.Exec(ctx, "cat /proc/self/uid_map; touch /tmp/y; ls -ln /tmp", sandbox.ExecOptions{})
	if err != nil || !strings.Contains(string(r.Stdout), fmt.Sprint(u.HostID)) {
		t.Fatalf("child: %v %q %q", err, r.Stdout, r.Stderr)
	}
	t.Logf("child: %q", r.Stdout)
}
