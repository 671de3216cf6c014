package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// userNS is the mode start boots sandboxes in: off, unless
// ARBOR_TEST_USERNS=1 runs the whole package in user namespace mode;
// TestUserNSMode turns it on for a subset.
var userNS = func() sandbox.UserNSConfig {
	if os.Getenv("ARBOR_TEST_USERNS") == "1" {
		return sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	}
	return sandbox.UserNSConfig{}
}()

// TestUserNSMode runs a subset of this package's tests with sandboxes in
// user namespace mode.
func TestUserNSMode(t *testing.T) {
	saved := userNS
	userNS = sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	defer func() { userNS = saved }()
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"maps root to the host range", testUserNSMapsRoot},
		{"ShellStatePersists", TestShellStatePersists},
		{"ResultFields", TestResultFields},
		{"TimeoutKeepsShell", TestTimeoutKeepsShell},
		{"ExitRestartsShell", TestExitRestartsShell},
		{"Isolation", TestIsolation},
		{"ForkBombStoppedByPidsLimit", TestForkBombStoppedByPidsLimit},
		{"MemoryHogStoppedByMemoryLimit", TestMemoryHogStoppedByMemoryLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.fn)
	}
}

// testUserNSMapsRoot: uid and gid 0 inside are the first host id of the
// range, a file made inside is owned by it on the host, the network
// namespace is the host's to administer but still serves low ports to root
// inside, and root inside has no power over host-wide kernel state.
func testUserNSMapsRoot(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	want := fmt.Sprintf("0 %d %d", userNS.HostID, userNS.Size)
	tests := []struct{ name, cmd, want string }{
		{"uid_map", "cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'", want + "\n"},
		{"gid_map", "cat /proc/1/gid_map | tr -s ' ' | sed 's/^ //'", want + "\n"},
		{"root inside", "id -u; id -g", "0\n0\n"},
		{"the init binary belongs to root inside", "ls -ln /.arbor/init | awk '{print $3}'", "0\n"},
		{"no capability over the network namespace", "ip link set lo down 2>/dev/null && echo changed || echo refused", "refused\n"},
		{"low port still bindable", "nc -l -p 80 -e true & sleep 0.2; netstat -ltn | grep -c ':80 '; kill %1", "1\n"},
		// Even with every capability of its namespace, root inside holds
		// none over the host's: the value written back is the one there.
		{"host sysctl not writable", "cat /proc/sys/kernel/core_pattern > /tmp/cp; cat /tmp/cp > /proc/sys/kernel/core_pattern 2>/dev/null && echo written || echo refused", "refused\n"},
		{"sysfs not mountable", "mkdir -p /mnt; mount -t sysfs s /mnt 2>/dev/null && { umount /mnt; echo mounted; } || echo refused", "refused\n"},
		{"cgroup2 not mountable", "mount -t cgroup2 c /mnt 2>/dev/null && { umount /mnt; echo mounted; } || echo refused", "refused\n"},
		{"kernel log unreadable", "dmesg >/dev/null 2>&1 && echo read || echo refused", "refused\n"},
		{"kernel addresses hidden", "head -1 /proc/kallsyms | cut -c1-16", "0000000000000000\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, sb, tt.cmd, 10*time.Second)
			if string(r.Stdout) != tt.want {
				t.Errorf("got %q (stderr %q, exit %d, timed out %v, shell restarted %v, %v), want %q", r.Stdout, r.Stderr, r.ExitCode, r.TimedOut, r.ShellRestarted, r.Duration, tt.want)
			}
		})
	}
	run(t, sb, "mkdir -p /work/d && echo x > /work/d/f", 5*time.Second)
	for _, p := range []string{"work/d", "work/d/f"} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(sb.Root(), p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != userNS.HostID || st.Gid != userNS.HostID {
			t.Errorf("/%s is owned by %d:%d on the host, want %d:%d", p, st.Uid, st.Gid, userNS.HostID, userNS.HostID)
		}
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", sb.InitPID(), f))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(strings.Fields(string(b)), " "); got != want {
			t.Errorf("init's %s seen from the host: %q, want %q", f, got, want)
		}
	}
}

// TestUserNSRefusesBadRoots: user namespace mode on a root the range does
// not own, or whose /dev is a symlink the host would write through, fails
// before anything starts.
func TestUserNSRefusesBadRoots(t *testing.T) {
	sandboxtest.RequireRoot(t)
	u := sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	tests := []struct {
		name    string
		prepare func(t *testing.T, root string)
		want    error
	}{
		{"unshifted", func(*testing.T, string) {}, sandbox.ErrUnshiftedRoot},
		{"dev is a symlink", func(t *testing.T, root string) {
			target := t.TempDir()
			if err := os.RemoveAll(filepath.Join(root, "dev")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(root, "dev")); err != nil {
				t.Fatal(err)
			}
			sandboxtest.ShiftRoot(t, root, u.HostID, u.Size)
		}, sandbox.ErrBadRoot},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := sandboxtest.BusyboxRoot(t, "")
			tt.prepare(t, root)
			_, err := sandbox.Start(context.Background(), sandbox.Config{ID: fmt.Sprintf("badroot-%d-%d", os.Getpid(), i), Root: root,
				InitBinary: sandboxtest.InitBinary(t), UserNS: u})
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// BenchmarkStartUserNS compares Start on a busybox root with and without
// user namespace mode (the root is made, and shifted, once).
func BenchmarkStartUserNS(b *testing.B) {
	sandboxtest.RequireRoot(b)
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("userns=%v", on), func(b *testing.B) {
			root := sandboxtest.BusyboxRoot(b, "")
			u := sandbox.UserNSConfig{Enabled: on}.WithDefaults()
			if on {
				sandboxtest.ShiftRoot(b, root, u.HostID, u.Size)
			}
			for i := 0; i < b.N; i++ {
				sb, err := sandbox.Start(context.Background(), sandbox.Config{ID: fmt.Sprintf("bench-%d-%d", os.Getpid(), i), Root: root,
					InitBinary: sandboxtest.InitBinary(b), UserNS: u})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := sb.Destroy(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
