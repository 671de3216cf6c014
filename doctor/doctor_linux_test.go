package doctor

import (
	"context"
	"os"
	"testing"
)

// TestHostAfterDeps runs the real checks on this machine and requires
// every required one to pass, as they do after `make deps`.
func TestHostAfterDeps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the checks mount tracefs, load bpf and run criu")
	}
	if testing.Short() {
		t.Skip("-short: runs criu and bpf on the host")
	}
	r := Run(context.Background(), NewHost(), Options{StateDir: os.TempDir()})
	for _, c := range r.Checks {
		t.Logf("%-20s %-4s %s", c.Name, c.Status, c.Detail)
		if c.Required && c.Status != OK {
			t.Errorf("%s: %s: %s (remedy: %s)", c.Name, c.Status, c.Detail, c.Remedy)
		}
	}
	if !r.OK {
		t.Error("report not OK")
	}
}
