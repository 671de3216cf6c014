package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
)

// TestFreezeClearsPendingTrap: compel refuses to dump a thread with a
// pending SIGTRAP, and a SIGTRAP that reaches a process catching it while
// the sandbox is frozen (what a process spamming it leaves when the freeze
// lands between its kill and the handler) stays pending. Init must not
// hold one at all (it leaves SIGTRAP at SIG_DFL, which the kernel drops
// for a namespace's init), and Freeze must wait for any other process to
// handle its own, so the dump succeeds. Both fail on the old code.
func TestFreezeClearsPendingTrap(t *testing.T) {
	r := newCRRig(t)
	sb, _ := r.start(t, sandbox.Isolation{})
	res, err := sb.Exec(context.Background(), `(trap : TRAP; while :; do sleep 1; done) </dev/null >/dev/null 2>&1 &`,
		sandbox.ExecOptions{Timeout: 5 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start the trapping loop: %+v %v", res, err)
	}
	// The loop runs in the background: wait until it has set its trap.
	catches := func() int {
		b, _ := os.ReadFile(filepath.Join(sb.FreezerCgroup(), "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if p, _ := strconv.Atoi(f); p != sb.InitPID() && trapIn(t, p, "SigCgt") {
				return p
			}
		}
		return 0
	}
	for deadline := time.Now().Add(10 * time.Second); catches() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	imgs := t.TempDir()
	err = sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		catcher := catches()
		if catcher == 0 {
			t.Fatal("no process of the sandbox catches SIGTRAP: the loop did not start")
		}
		for _, p := range []int{sb.InitPID(), catcher} {
			if err := syscall.Kill(p, syscall.SIGTRAP); err != nil {
				return err
			}
		}
		if trapIn(t, sb.InitPID(), "SigPnd", "ShdPnd") {
			t.Error("SIGTRAP sent to init is pending: init catches it")
		}
		if !trapIn(t, catcher, "SigPnd", "ShdPnd") {
			t.Fatal("SIGTRAP sent to the frozen loop is not pending: the test does not set up the window")
		}
		if err := sb.Freeze(); err != nil {
			return err
		}
		if trapIn(t, catcher, "SigPnd", "ShdPnd") {
			t.Error("SIGTRAP still pending on the loop after Freeze")
		}
		_, err = r.c.Dump(context.Background(), criu.DumpRequest{PID: sb.InitPID(), Dir: imgs, FreezeCgroup: sb.FreezerCgroup()})
		return err
	})
	if err != nil {
		t.Fatalf("dump with a SIGTRAP sent to the frozen sandbox: %v", err)
	}
}

// trapIn reports whether SIGTRAP (bit 4) is in any of the named signal
// masks of /proc/P/status.
func trapIn(t *testing.T, p int, masks ...string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, m := range masks {
			if k != m {
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if n&(1<<(syscall.SIGTRAP-1)) != 0 {
				return true
			}
		}
	}
	return false
}
