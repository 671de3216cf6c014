// Package pythonclient_test runs the Python client's unittest suite from
// `go test`, so that `make test` covers it: framing against a fake server
// always, end to end against a freshly built `arbor serve` when the host
// can run sandboxes.
package pythonclient_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// python finds an interpreter that has msgpack and websockets: Debian's
// /usr/bin/python3 first (python3-msgpack, python3-websockets), then the
// python3 on PATH.
func python(t *testing.T) string {
	t.Helper()
	cands := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	for _, p := range cands {
		if exec.Command(p, "-c", "import msgpack, websockets").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with msgpack and websockets: run make deps (python3-msgpack, python3-websockets)")
	return ""
}

func TestPythonClient(t *testing.T) {
	py := python(t)
	env := os.Environ()
	if os.Getenv("ARBOR_BIN") == "" && os.Geteuid() == 0 {
		// Build the server from this tree so the end-to-end tests never
		// run a stale bin/arbor.
		bin := filepath.Join(t.TempDir(), "arbor")
		build := exec.Command("go", "build", "-o", bin, "../../cmd/arbor")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build arbor: %v\n%s", err, out)
		}
		env = append(env, "ARBOR_BIN="+bin)
		if os.Getenv("ARBOR_INIT") == "" {
			init := filepath.Join(filepath.Dir(bin), "arbor-init")
			build := exec.Command("go", "build", "-o", init, "../../cmd/arbor-init")
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build arbor-init: %v\n%s", err, out)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v")
	cmd.Env = append(env, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("python client tests failed: %v", err)
	}
}
