package sandbox_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
)

// TestFreezeClearsPendingTrap: a SIGTRAP that reaches init while the
// sandbox is frozen (what a process of the sandbox spamming init leaves
// when the freeze lands between its kill and init's handler) stays
// pending, and compel refuses to dump a thread with a pending SIGTRAP.
// Freeze must hand CRIU a tree with none pending, so the dump succeeds.
func TestFreezeClearsPendingTrap(t *testing.T) {
	r := newCRRig(t)
	sb, _ := r.start(t, sandbox.Isolation{})
	imgs := t.TempDir()
	err := sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		if err := syscall.Kill(sb.InitPID(), syscall.SIGTRAP); err != nil {
			return err
		}
		if !trapPendingAt(t, sb.InitPID()) {
			t.Fatal("SIGTRAP sent to frozen init is not pending: the test does not set up the window")
		}
		if err := sb.Freeze(); err != nil {
			return err
		}
		if trapPendingAt(t, sb.InitPID()) {
			t.Error("SIGTRAP still pending on init after Freeze")
		}
		_, err := r.c.Dump(context.Background(), criu.DumpRequest{PID: sb.InitPID(), Dir: imgs, FreezeCgroup: sb.FreezerCgroup()})
		return err
	})
	if err != nil {
		t.Fatalf("dump with a SIGTRAP sent to frozen init: %v", err)
	}
}

// trapPendingAt reads SigPnd and ShdPnd of host pid p (SIGTRAP is bit 4).
func trapPendingAt(t *testing.T, p int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "SigPnd" || k == "ShdPnd") {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if m&(1<<(syscall.SIGTRAP-1)) != 0 {
				return true
			}
		}
	}
	return false
}
