package launch_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

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
