package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// startIso boots a busybox sandbox with the given isolation.
func startIso(t *testing.T, iso sandbox.Isolation) (*sandbox.Sandbox, error) {
	t.Helper()
	sandboxtest.RequireRoot(t)
	var root string
	if debian() {
		root = sandboxtest.DebianRoot(t, "")
	} else {
		root = sandboxtest.BusyboxRoot(t, "")
	}
	testCount++
	id := fmt.Sprintf("test-%d-%d", os.Getpid(), testCount)
	sb, err := sandbox.Start(context.Background(), sandbox.Config{ID: id, Root: root, InitBinary: sandboxtest.InitBinary(t), Isolation: iso})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return sb, nil
}

// debian: the tests run on the Debian image (bash, python3).
func debian() bool { return os.Getenv("ARBOR_TEST_IMAGE") == "debian" }

// statusInside reads the isolation fields of a /proc/PID/status as seen
// from the sandbox's shell.
func statusInside(t *testing.T, sb *sandbox.Sandbox, path string) sandbox.TaskIsolation {
	t.Helper()
	r := run(t, sb, "grep -E 'Cap|NoNewPrivs|Seccomp' "+path, 5*time.Second)
	st, err := sandbox.ParseTaskIsolation(r.Stdout)
	if err != nil {
		t.Fatalf("%s inside: %v (%q %q)", path, err, r.Stdout, r.Stderr)
	}
	return st
}

const dockerCaps sandbox.CapSet = 0xa80425fb

func TestHardenedByDefault(t *testing.T) {
	sb, err := startIso(t, sandbox.Isolation{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/proc/1/status", "/proc/self/status"} {
		st := statusInside(t, sb, p)
		for name, v := range map[string]sandbox.CapSet{"CapEff": st.CapEff, "CapPrm": st.CapPrm, "CapBnd": st.CapBnd, "CapInh": st.CapInh} {
			if v != dockerCaps {
				t.Errorf("%s %s = %s, want Docker's %s", p, name, v, dockerCaps)
			}
		}
		if st.CapAmb != 0 || st.NoNewPrivs != 1 || st.Seccomp != 2 || st.SeccompFilters != 1 {
			t.Errorf("%s: %v, want no ambient caps, NoNewPrivs 1, Seccomp 2 with one filter", p, st)
		}
	}
	rec, err := sb.Isolation()
	if err != nil || !rec.Hardened || rec.Caps != dockerCaps || rec.ShellPID == 0 {
		t.Fatalf("record %+v, %v", rec, err)
	}
	// Each command prints "denied" when the kernel refused, or something
	// else; a write is only ever of the value already there.
	tests := []struct{ name, cmd, want string }{
		{"mount tmpfs", "mkdir -p /mnt; mount -t tmpfs x /mnt 2>/dev/null && echo mounted || echo denied", "denied\n"},
		{"mount sysfs", "mkdir -p /mnt; mount -t sysfs s /mnt 2>/dev/null && echo mounted || echo denied", "denied\n"},
		{"mount proc", "mkdir -p /mnt; mount -t proc p /mnt 2>/dev/null && echo mounted || echo denied", "denied\n"},
		{"tmpfs over /proc", "mount -t tmpfs x /proc 2>/dev/null && echo mounted || echo denied", "denied\n"},
		{"unmount a mask", "umount /proc/keys 2>/dev/null && echo unmounted || echo denied", "denied\n"},
		{"core_pattern write-back", "v=$(cat /proc/sys/kernel/core_pattern); printf '%s\\n' \"$v\" 2>/dev/null >/proc/sys/kernel/core_pattern && echo written || echo denied", "denied\n"},
		{"core_pattern is read-only", "v=$(cat /proc/sys/kernel/core_pattern); printf '%s\\n' \"$v\" 2>&1 >/proc/sys/kernel/core_pattern | grep -o 'Read-only file system'", "Read-only file system\n"},
		{"kcore reads nothing", "cat /proc/kcore 2>/dev/null | wc -c | tr -d ' '", "0\n"},
		{"keys reads nothing", "cat /proc/keys 2>/dev/null | wc -c | tr -d ' '", "0\n"},
		{"timer_list reads nothing", "cat /proc/timer_list 2>/dev/null | wc -c | tr -d ' '", "0\n"},
		{"kallsyms addresses are zeros", "test -e /proc/kallsyms || { echo zeros; exit 0; }; head -n 50 /proc/kallsyms | awk '$1 != \"0000000000000000\" {bad=1} END {print bad ? \"addresses\" : \"zeros\"}'", "zeros\n"},
		{"kernel log", "dmesg >/dev/null 2>&1 && echo read || echo denied", "denied\n"},
		{"masked dir is empty", "test -d /proc/acpi || { echo 0; exit 0; }; ls -A /proc/acpi | wc -l | tr -d ' '", "0\n"},
		{"masked dir is read-only", "test -d /proc/acpi || { echo denied; exit 0; }; touch /proc/acpi/x 2>/dev/null && echo written || echo denied", "denied\n"},
		{"mknod of a block device", "mknod /tmp/blk b 7 0 2>/dev/null && echo made || echo denied", "denied\n"},
		{"mknod of /dev/mem", "mknod /tmp/mem c 1 1 2>/dev/null && echo made || echo denied", "denied\n"},
		{"mknod of an allowed node", "mknod /tmp/null2 c 1 3 && echo hi >/tmp/null2 && rm /tmp/null2 && echo made", "made\n"},
		{"no other devices in /dev", "ls /dev | tr '\\n' ' '", devList()},
		{"unshare a user namespace", "unshare -U true 2>/dev/null && echo unshared || echo denied", "denied\n"},
		{"setns-free chroot still works", "chroot / true && echo ok", "ok\n"},
	}
	if debian() {
		// Arbor's own rule: nothing may type into the shell's terminal,
		// which the kernel allows a process on its own terminal.
		tests = append(tests, struct{ name, cmd, want string }{"TIOCSTI on the shell's terminal",
			`python3 -c 'import fcntl, os, termios
try:
    fcntl.ioctl(os.open("/dev/tty", os.O_RDWR), termios.TIOCSTI, b"x")
    print("injected")
except PermissionError:
    print("denied")'`, "denied\n"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, sb, tt.cmd, 10*time.Second)
			if string(r.Stdout) != tt.want {
				t.Errorf("got %q (stderr %q, exit %d, timed out %v, shell restarted %v, %v), want %q", r.Stdout, r.Stderr, r.ExitCode, r.TimedOut, r.ShellRestarted, r.Duration, tt.want)
			}
		})
	}
}

func TestTaskWithFewerCaps(t *testing.T) {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}
	sb, err := startIso(t, sandbox.Isolation{Caps: caps})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := sandbox.ParseCaps(caps)
	for _, p := range []string{"/proc/1/status", "/proc/self/status"} {
		st := statusInside(t, sb, p)
		if st.CapEff != want || st.CapBnd != want || st.CapPrm != want || st.CapInh != want || st.Seccomp != 2 || st.NoNewPrivs != 1 {
			t.Errorf("%s: %v, want every set %s, seccomp and no_new_privs", p, st, want)
		}
	}
	for _, cmd := range []string{"chroot / true", "mknod /tmp/null2 c 1 3"} {
		if r := run(t, sb, cmd, 5*time.Second); r.ExitCode == 0 {
			t.Errorf("%q succeeded without its capability", cmd)
		}
	}
	if r := run(t, sb, "echo works > /tmp/f && cat /tmp/f", 5*time.Second); string(r.Stdout) != "works\n" {
		t.Errorf("shell does not work with fewer caps: %+v", r)
	}
}

func TestExtraCapsNeedTheServerFlag(t *testing.T) {
	extra := append(append([]string{}, sandbox.DefaultCaps...), "CAP_SYS_PTRACE")
	_, err := startIso(t, sandbox.Isolation{Caps: extra})
	if !errors.Is(err, sandbox.ErrIsolation) || !strings.Contains(err.Error(), "CAP_SYS_PTRACE") || !strings.Contains(err.Error(), "--allow-extra-caps") {
		t.Fatalf("start asking for CAP_SYS_PTRACE: %v, want an ErrIsolation naming it and the flag", err)
	}
	sb, err := startIso(t, sandbox.Isolation{Caps: extra, AllowExtraCaps: true})
	if err != nil {
		t.Fatal(err)
	}
	if st := statusInside(t, sb, "/proc/self/status"); st.CapEff != dockerCaps|1<<19 || st.Seccomp != 2 {
		t.Fatalf("with --allow-extra-caps: %v, want %s", st, dockerCaps|1<<19)
	}
}

func TestUnhardened(t *testing.T) {
	sb, err := startIso(t, sandbox.Isolation{Unhardened: true})
	if err != nil {
		t.Fatal(err)
	}
	st := statusInside(t, sb, "/proc/self/status")
	if st.Seccomp != 0 || st.NoNewPrivs != 0 || st.CapBnd == dockerCaps {
		t.Fatalf("unhardened shell: %v, want no seccomp, no no_new_privs, more than Docker's caps", st)
	}
	if r := run(t, sb, "awk '$5 ~ /^\\/proc\\// {print $5}' /proc/self/mountinfo | wc -l | tr -d ' '", 5*time.Second); string(r.Stdout) != "0\n" {
		t.Fatalf("unhardened sandbox has /proc masks: %q", r.Stdout)
	}
}

// devList is what /dev of a sandbox holds: the nodes makeDev creates (tty
// only where the shell is bash), ptmx, pts, shm and the fd links.
func devList() string {
	if debian() {
		return "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero "
	}
	return "fd full null ptmx pts random shm stderr stdin stdout urandom zero "
}
