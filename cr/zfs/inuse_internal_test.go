package zfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInUseWhenZpoolCannotTell: a zpool that fails (a daemon too busy
// to answer) counts as a pool in use, so Close leaves the daemon running
// rather than stop it under another process; a zpool that answers is
// read as it says, FAULTED and UNAVAIL pools left out.
func TestInUseWhenZpoolCannotTell(t *testing.T) {
	bin := t.TempDir()
	fake := filepath.Join(bin, "zpool")
	t.Setenv("PATH", bin)
	write := func(script string) {
		t.Helper()
		if err := os.WriteFile(fake, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("echo 'connect: Connection refused' >&2; exit 1")
	if got := inUse(); len(got) != 1 || !strings.Contains(got[0], "unknown") {
		t.Errorf("zpool failing: in use %q, want one unknown entry", got)
	}
	write("printf 'a\\tONLINE\\nb\\tFAULTED\\nc\\tUNAVAIL\\nd\\tDEGRADED\\n'")
	if got := strings.Join(inUse(), " "); got != "a d" {
		t.Errorf("zpool answering: in use %q, want \"a d\"", got)
	}
	write("true")
	if got := inUse(); len(got) != 0 {
		t.Errorf("no pools: in use %q", got)
	}
}
