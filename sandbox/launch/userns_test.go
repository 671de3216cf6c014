package launch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
)

// TestLaunchUserNS: a launcher in user namespace mode clones the shifted
// copy of the image (made once), not the image itself, and starts the
// sandbox in the mode; the plain image is left as it was.
func TestLaunchUserNS(t *testing.T) {
	l := newLauncher(t)
	l.UserNS = sandbox.UserNSConfig{Enabled: true}
	u := l.UserNS.WithDefaults()
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		e, err := l.Launch(ctx, "busybox")
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.Sandbox.Exec(ctx, "cat /proc/self/uid_map", sandbox.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Join(strings.Fields(string(r.Stdout)), " "), fmt.Sprintf("0 %d %d", u.HostID, u.Size); got != want {
			t.Errorf("launch %d: uid_map %q, want %q", i, got, want)
		}
		if e.Sandbox.UserNS() != u {
			t.Errorf("launch %d: mode %v, want %v", i, e.Sandbox.UserNS(), u)
		}
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	vols, err := l.Snap.List(ctx, image.ShiftedPrefix)
	if err != nil || len(vols) != 1 || vols[0].Name != image.ShiftedName("busybox", u.HostID) {
		t.Errorf("shifted copies %v (%v), want one: %s", vols, err, image.ShiftedName("busybox", u.HostID))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(l.Snap.Path(image.SnapshotName("busybox")), &st); err != nil || st.Uid != 0 {
		t.Errorf("the image itself: owner %d (%v), want host root", st.Uid, err)
	}
}

// TestLaunchOtherUsers: an image labelled as running other users
// (image.LabelOtherUsers) starts in user namespace mode where the server
// lacks CAP_SYS_RESOURCE (a daemon of another uid could not be
// checkpointed with host ids), with host ids where it has it; an
// unlabelled image of root starts with host ids either way.
func TestLaunchOtherUsers(t *testing.T) {
	l := newLauncher(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "users.yaml")
	if err := os.WriteFile(p, []byte("base: busybox\nlabels: {"+image.LabelOtherUsers+": \"true\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := l.Images.BuildRecipe(ctx, "users", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Config.OtherUsers() {
		t.Fatalf("config %+v: the recipe's label is missing", in.Config)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var eff uint64
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	hasCap := eff&(1<<unix.CAP_SYS_RESOURCE) != 0
	t.Logf("CAP_SYS_RESOURCE: %v", hasCap)
	for _, tt := range []struct {
		name, image string
		userns      bool
	}{
		{"labelled", "users", !hasCap},
		{"unlabelled", "busybox", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, err := l.Launch(ctx, tt.image)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(ctx)
			if got := e.Sandbox.UserNS().Enabled; got != tt.userns {
				t.Errorf("user namespace mode %v, want %v", got, tt.userns)
			}
		})
	}
}
