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

	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// TestUserNSDumpRestore: a sandbox in user namespace mode on a shifted root
// dumps and restores; the child keeps the uid map and the shell's state.
func TestUserNSDumpRestore(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	u := sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	if err := snap.CreateVolume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	root := sandboxtest.BusyboxRoot(t, "")
	if os.Getenv("ARBOR_TEST_IMAGE") == "debian" {
		root = sandboxtest.DebianRoot(t, "")
	}
	if out, err := exec.Command("cp", "-a", root+"/.", snap.Path("src")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := image.Shift(snap.Path("src"), u.HostID, u.Size); err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "usrc", Root: snap.Path("src"), InitBinary: sandboxtest.InitBinary(t), UserNS: u})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	want := fmt.Sprintf("0 %d %d", u.HostID, u.Size)
	check := func(sb *sandbox.Sandbox, who string) {
		t.Helper()
		r, err := sb.Exec(ctx, "cat /proc/self/uid_map /proc/self/gid_map; id -u; touch /tmp/f-"+who, sandbox.ExecOptions{})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: %v %+v", who, err, r)
		}
		lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
		if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != want || strings.Join(strings.Fields(lines[1]), " ") != want || lines[2] != "0" {
			t.Fatalf("%s: maps and id %q, want %q twice and uid 0", who, r.Stdout, want)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(sb.Root(), "tmp", "f-"+who), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != u.HostID || st.Gid != u.HostID {
			t.Fatalf("%s: file owned by %d:%d on the host, want %d", who, st.Uid, st.Gid, u.HostID)
		}
	}
	check(sb, "src")
	if r, err := sb.Exec(ctx, "cd /tmp; export K=v; (while :; do sleep 0.05; done) >/dev/null 2>&1 &", sandbox.ExecOptions{}); err != nil || r.ExitCode != 0 {
		t.Fatalf("%v %+v", err, r)
	}
	imgs := t.TempDir()
	_, rec := dump(t, c, snap, sb, "snap1", imgs, true)
	if err := snap.Clone(ctx, "snap1", "child"); err != nil {
		t.Fatal(err)
	}
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: "uchild", Root: snap.Path("child"), UserNS: u}, rec, func(join func(int) error) (int, error) {
		return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: snap.Path("child"), Join: join, UserNS: true})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Destroy(ctx)
	check(child, "child")
	r, err := child.Exec(ctx, "echo $K; pwd", sandbox.ExecOptions{})
	if err != nil || string(r.Stdout) != "v\n/tmp\n" {
		t.Fatalf("child state: %v %q %q", err, r.Stdout, r.Stderr)
	}
}
