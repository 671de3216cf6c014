package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestFreezeTimeoutThaws: a group the kernel never reports frozen (a task
// the freezer cannot stop) fails the freeze with ErrTimeout after
// freezeWait and is thawed again, not left half frozen for every later
// command to hang on. The cgroup files are faked: the kernel's freezer
// cannot be made to stall on purpose.
func TestFreezeTimeoutThaws(t *testing.T) {
	dir := t.TempDir()
	for name, v := range map[string]string{"cgroup.freeze": "0\n", "cgroup.events": "populated 1\nfrozen 0\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg := &cgroup{v2: dir}
	if err := cg.freeze(true); !errors.Is(err, ErrTimeout) {
		t.Fatalf("freeze never reported: %v, want ErrTimeout", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); string(b) != "0" {
		t.Errorf("cgroup.freeze after the failed freeze: %q, want 0", b)
	}
	if err := cg.freeze(false); err != nil {
		t.Errorf("thaw of a group reported thawed: %v", err)
	}
}
