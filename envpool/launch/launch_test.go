package launch_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/envpool/launch"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
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
	b.Run("sandbox", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := e.Sandbox.Exec(ctx, "echo hi", sandbox.ExecOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
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
