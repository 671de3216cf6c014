package launch_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// newLauncher makes a launcher on a fresh loop-mounted btrfs pool that is
// unmounted when tb ends.
func newLauncher(tb testing.TB) *launch.Launcher {
	tb.Helper()
	sandboxtest.RequireRoot(tb)
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		tb.Skip("btrfs-progs not installed: run make deps")
	}
	snap, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: tb.TempDir(), PoolSize: 2 << 30})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := snap.Unmount(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	quiet := slog.New(slog.DiscardHandler)
	return &launch.Launcher{Snap: snap, Images: &image.Store{Snap: snap, Logger: quiet}, Logger: quiet, InitBinary: sandboxtest.InitBinary(tb), AutoBuild: true}
}

func TestLaunchOnBtrfsClone(t *testing.T) {
	l := newLauncher(t)
	ctx := context.Background()
	a, err := l.Launch(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Launch(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sandbox.Exec(ctx, "echo mine > /work/f", sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := b.Sandbox.Exec(ctx, "cat /work/f 2>&1; echo end", sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(r.Stdout), "No such file") {
		t.Errorf("a second env sees the first one's file: %q", r.Stdout)
	}
	for _, e := range []*launch.Env{a, b} {
		root := e.Sandbox.Root()
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(root); !os.IsNotExist(err) {
			t.Errorf("volume %s still there after Close (%v)", root, err)
		}
	}
	if _, err := l.Launch(ctx, "no-such-image"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("launch of a missing image: %v", err)
	}
}

// BenchmarkLaunch measures sandbox start from an image: btrfs clone, init,
// shell ready, and the teardown.
func BenchmarkLaunch(b *testing.B) {
	l := newLauncher(b)
	ctx := context.Background()
	e, err := l.Launch(ctx, "busybox") // builds the image once
	if err != nil {
		b.Fatal(err)
	}
	e.Close(ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e, err := l.Launch(ctx, "busybox")
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		e.Close(ctx)
		b.StartTimer()
	}
}

// BenchmarkCommandRoundTrip compares one command in the sandbox's persistent
// shell with the same command run by a fresh `sh -c` on the host.
func BenchmarkCommandRoundTrip(b *testing.B) {
	l := newLauncher(b)
	ctx := context.Background()
	e, err := l.Launch(ctx, "busybox")
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	l.Limits.DiskBytes = -1
	noQuota, err := l.Launch(ctx, "busybox")
	if err != nil {
		b.Fatal(err)
	}
	defer noQuota.Close(ctx)
	// The default quota costs one meter read after each command.
	for _, tt := range []struct {
		name string
		env  *launch.Env
	}{{"sandbox", e}, {"sandbox-no-disk-quota", noQuota}} {
		b.Run(tt.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := tt.env.Sandbox.Exec(ctx, "echo hi", sandbox.ExecOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("host-sh-c", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := exec.Command("/bin/sh", "-c", "echo hi").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("host-bash-c", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := exec.Command("/bin/bash", "-c", "echo hi").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// diskEvent returns r's disk limit event, or nil.
func diskEvent(r *sandbox.Result) *sandbox.LimitEvent {
	for i := range r.Limits {
		if r.Limits[i].Resource == "disk" {
			return &r.Limits[i]
		}
	}
	return nil
}

// dd until full inside a sandbox stops at its quota with "Disk quota
// exceeded" and a disk limit event; another sandbox can still write, a new
// one can still start, and after rm the first can write again.
// TestConcurrentFirstLaunches: two launches of an image a fresh pool
// lacks, at once, both succeed (AutoBuild: they share one build,
// image.Store.Ensure) instead of one failing with "already exists".
func TestConcurrentFirstLaunches(t *testing.T) {
	l := newLauncher(t)
	ctx := context.Background()
	envs := make([]*launch.Env, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			envs[i], errs[i] = l.Launch(ctx, "busybox")
		}()
	}
	close(start)
	wg.Wait()
	for i, e := range envs {
		if errs[i] != nil {
			t.Errorf("launch %d: %v", i, errs[i])
			continue
		}
		if r, err := e.Sandbox.Exec(ctx, "echo ok", sandbox.ExecOptions{}); err != nil || strings.TrimSpace(string(r.Stdout)) != "ok" {
			t.Errorf("launch %d: echo ok: %q %v", i, r.Stdout, err)
		}
		if err := e.Close(ctx); err != nil {
			t.Error(err)
		}
	}
}

func TestDiskQuota(t *testing.T) {
	l := newLauncher(t)
	const quota = 48 << 20
	l.Limits = sandbox.Limits{DiskBytes: quota}
	ctx := context.Background()
	exec := func(e *launch.Env, cmd string) *sandbox.Result {
		t.Helper()
		r, err := e.Sandbox.Exec(ctx, cmd, sandbox.ExecOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return r
	}
	a, err := l.Launch(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := l.Launch(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)

	r := exec(a, "dd if=/dev/zero of=/big bs=1M; echo exit=$?; wc -c < /big")
	out := string(r.Stdout) + string(r.Stderr)
	if !strings.Contains(out, "Disk quota exceeded") || !strings.Contains(out, "exit=1") {
		t.Fatalf("dd past the quota: want it to fail with Disk quota exceeded, got %q", out)
	}
	lines := strings.Fields(string(r.Stdout))
	n, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	if err != nil || n > quota || n < quota-4<<20 {
		t.Fatalf("dd wrote %s bytes (%v), want a little under the %d byte quota", lines[len(lines)-1], err, quota)
	}
	ev := diskEvent(r)
	if ev == nil || ev.Limit != quota {
		t.Fatalf("limit events %v: want a disk event with limit %d", r.Limits, quota)
	}
	t.Logf("dd stopped after %d bytes; event: %s", n, ev)
	if r := exec(a, "echo x > /small; echo exit=$?"); !strings.Contains(string(r.Stdout), "exit=1") || diskEvent(r) != nil {
		t.Fatalf("small write into a full sandbox: %q %q, events %v: want it refused and no second event", r.Stdout, r.Stderr, r.Limits)
	}
	// A full sandbox takes nothing from another: b writes most of its own
	// quota.
	if r := exec(b, "dd if=/dev/zero of=/big bs=1M count=40 2>&1; echo exit=$?"); !strings.Contains(string(r.Stdout), "exit=0") || diskEvent(r) != nil {
		t.Fatalf("second sandbox: %q, events %v: want 40 MiB written", r.Stdout, r.Limits)
	}
	c, err := l.Launch(ctx, "busybox")
	if err != nil {
		t.Fatalf("launch next to a full sandbox: %v", err)
	}
	c.Close(ctx)
	if r := exec(a, "rm /big && dd if=/dev/zero of=/after bs=1M count=8 2>&1; echo exit=$?"); !strings.Contains(string(r.Stdout), "exit=0") {
		t.Fatalf("write after rm: %q", r.Stdout)
	}
}
