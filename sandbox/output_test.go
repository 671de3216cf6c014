package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

// TestHugeOutputInSmallSandbox runs commands writing 300 MB with a
// max_output far above what the sandbox's 64 MiB of memory could hold.
// Init once buffered output in the sandbox's memory, was OOM-killed, and
// the sandbox was dead for good; now it streams output to the server,
// which keeps at most sandbox.MaxOutputCeiling of each stream.
func TestHugeOutputInSmallSandbox(t *testing.T) {
	sb := start(t, sandbox.Limits{MemoryBytes: 64 << 20})
	ctx := context.Background()
	const n = 300000000
	check := func(what string, r *sandbox.Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if r.ExitCode != 0 || r.TimedOut || r.StdoutBytes != n || !r.Truncated {
			t.Fatalf("%s: exit %d, timed out %v, stdout_bytes %d, truncated %v, stderr %q; want exit 0, %d bytes, truncated", what, r.ExitCode, r.TimedOut, r.StdoutBytes, r.Truncated, r.Stderr, n)
		}
		if len(r.Stdout) < sandbox.MaxOutputCeiling || len(r.Stdout) > sandbox.MaxOutputCeiling+100 {
			t.Errorf("%s: kept %d bytes, want the ceiling %d plus a marker", what, len(r.Stdout), sandbox.MaxOutputCeiling)
		}
		if !strings.HasSuffix(string(r.Stdout), "y\ny\n") {
			t.Errorf("%s: tail lost: %q", what, r.Stdout[len(r.Stdout)-20:])
		}
		for _, e := range r.Limits {
			t.Errorf("%s: limit event %v", what, e)
		}
	}
	cmd := fmt.Sprintf("yes | head -c %d", n)
	r, err := sb.Exec(ctx, cmd, sandbox.ExecOptions{MaxOutput: 1 << 62})
	check("exec", r, err)
	r, err = sb.Run(ctx, cmd, sandbox.RunOptions{MaxOutput: 1 << 62})
	check("run", r, err)
	select {
	case <-sb.Exited():
		t.Fatal("init exited")
	default:
	}
	r = run(t, sb, "echo still here", 10*time.Second)
	if string(r.Stdout) != "still here\n" || r.ShellRestarted {
		t.Errorf("next command: stdout %q, shell restarted %v", r.Stdout, r.ShellRestarted)
	}
	for _, e := range r.Limits {
		t.Errorf("next command: limit event %v", e)
	}
	// The peak is what the sandbox's memory cgroup (v2, or v1 on a hybrid
	// host) was charged at most: init's own memory and the pipes.
	for _, f := range []string{filepath.Join(sb.FreezerCgroup(), "memory.peak"), filepath.Join("/sys/fs/cgroup/memory/arbor", sb.ID(), "memory.max_usage_in_bytes")} {
		if b, err := os.ReadFile(f); err == nil {
			t.Logf("%s: %s", f, strings.TrimSpace(string(b)))
		}
	}
}

// TestEndlessOutputTimesOut: a command that writes without end still times
// out, and its shell stays.
func TestEndlessOutputTimesOut(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	r := run(t, sb, "X=kept; yes", 2*time.Second)
	if !r.TimedOut || r.StdoutBytes == 0 || !r.Truncated {
		t.Errorf("yes: timed out %v, stdout_bytes %d, truncated %v; want a timeout with output", r.TimedOut, r.StdoutBytes, r.Truncated)
	}
	r = run(t, sb, "echo $X", 10*time.Second)
	if string(r.Stdout) != "kept\n" || r.ShellRestarted {
		t.Errorf("next command: stdout %q, shell restarted %v", r.Stdout, r.ShellRestarted)
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
