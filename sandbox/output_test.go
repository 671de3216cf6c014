package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// startImage boots a sandbox on a fresh busybox or debian root and
// destroys it at the end.
func startImage(tb testing.TB, image string, lim sandbox.Limits) *sandbox.Sandbox {
	tb.Helper()
	sandboxtest.RequireRoot(tb)
	var root string
	if image == "debian" {
		root = sandboxtest.DebianRoot(tb, "")
	} else {
		root = sandboxtest.BusyboxRoot(tb, "")
	}
	if userNS.Enabled {
		sandboxtest.ShiftRoot(tb, root, userNS.HostID, userNS.Size)
	}
	testCount++
	id := fmt.Sprintf("test-%d-%d", os.Getpid(), testCount)
	sb, err := sandbox.Start(context.Background(), sandbox.Config{ID: id, Root: root, InitBinary: sandboxtest.InitBinary(tb), Limits: lim, UserNS: userNS})
	if err != nil {
		tb.Fatalf("start sandbox: %v", err)
	}
	tb.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			tb.Errorf("destroy: %v", err)
		}
	})
	return sb
}

// TestLargeOutputThroughShell moves 200 MB through a pipeline of the
// persistent shell and 200 MB to its stdout, each within the default
// timeout, and checks the byte counts. Busybox applets in the shell once
// wrote line by line (about 1.3 MB/s): both timed out.
func TestLargeOutputThroughShell(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	const n = 200000000
	r, err := sb.Exec(context.Background(), fmt.Sprintf("yes | head -c %d | wc -c", n), sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.TimedOut || r.ExitCode != 0 || strings.TrimSpace(string(r.Stdout)) != fmt.Sprint(n) {
		t.Fatalf("pipeline: timed out %v, exit %d, stdout %q, stderr %q; want %d", r.TimedOut, r.ExitCode, r.Stdout, r.Stderr, n)
	}
	r, err = sb.Exec(context.Background(), fmt.Sprintf("yes | head -c %d", n), sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.TimedOut || r.ExitCode != 0 || r.StdoutBytes != n || !r.Truncated {
		t.Fatalf("direct: timed out %v, exit %d, stdout_bytes %d, truncated %v, stderr %q; want %d bytes, truncated", r.TimedOut, r.ExitCode, r.StdoutBytes, r.Truncated, r.Stderr, n)
	}
	if !strings.HasPrefix(string(r.Stdout), "y\ny\n") || !strings.HasSuffix(string(r.Stdout), "y\ny\n") {
		t.Errorf("head or tail lost: %q...%q", r.Stdout[:20], r.Stdout[len(r.Stdout)-20:])
	}
}

// BenchmarkShellOutput compares the persistent shell with a fresh sh -c
// started from it, for a pipeline whose bytes stay inside the sandbox
// (| wc -c) and for output that init reads (direct), in busybox (ash) and
// debian (bash) sandboxes.
func BenchmarkShellOutput(b *testing.B) {
	for _, image := range []string{"busybox", "debian"} {
		b.Run(image, func(b *testing.B) {
			sb := startImage(b, image, sandbox.Limits{})
			for _, size := range []int{1 << 20, 100 << 20} {
				for _, kind := range []string{"pipe", "direct"} {
					cmd := fmt.Sprintf("yes | head -c %d", size)
					if kind == "pipe" {
						cmd += " | wc -c"
					}
					for _, how := range []string{"shell", "sh-c"} {
						c := cmd
						if how == "sh-c" {
							c = "sh -c '" + cmd + "'"
						}
						b.Run(fmt.Sprintf("%s/%dMiB/%s", kind, size>>20, how), func(b *testing.B) {
							b.SetBytes(int64(size))
							for i := 0; i < b.N; i++ {
								r, err := sb.Exec(context.Background(), c, sandbox.ExecOptions{Timeout: 120 * time.Second})
								if err != nil {
									b.Fatal(err)
								}
								if r.ExitCode != 0 || r.TimedOut {
									b.Fatalf("%q: exit %d timed out %v: %s", c, r.ExitCode, r.TimedOut, r.Stderr)
								}
							}
						})
					}
				}
			}
		})
	}
}
