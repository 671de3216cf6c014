package image_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/image"
)

// checkOneImage fails unless snap holds exactly one image, busybox, and
// no build volume is left over.
func checkOneImage(t *testing.T, s *image.Store, snap cr.Snapshotter) {
	t.Helper()
	ctx := context.Background()
	imgs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "busybox" {
		t.Errorf("images %+v, want busybox alone", imgs)
	}
	if vols, err := snap.List(ctx, "image-builds/"); err != nil || len(vols) != 0 {
		t.Errorf("build volumes left over: %v %v", vols, err)
	}
}

// TestEnsureConcurrent: concurrent Ensures of a missing image on a fresh
// store (first launches with AutoBuild) all succeed and share one build
// (one progress writer hears from it), whether they ask one Store or
// several on the same snapshotter; a plain Build of an image that exists
// still answers ErrExists.
func TestEnsureConcurrent(t *testing.T) {
	requireStaticBusybox(t)
	for _, stores := range []int{1, 2} {
		s, snap := btrfsStore(t, t.TempDir())
		ss := []*image.Store{s}
		for len(ss) < stores {
			ss = append(ss, &image.Store{Snap: snap, CacheDir: s.CacheDir})
		}
		const n = 4
		ctx := context.Background()
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, n)
		progress := make([]bytes.Buffer, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				in, err := ss[i%len(ss)].Ensure(ctx, "busybox", &progress[i])
				if err == nil && in.Name != "busybox" {
					t.Errorf("ensure %d: got image %+v", i, in)
				}
				errs[i] = err
			}()
		}
		close(start)
		wg.Wait()
		built := 0
		for i := range n {
			if errs[i] != nil {
				t.Errorf("%d stores: ensure %d: %v", stores, i, errs[i])
			}
			if progress[i].Len() > 0 {
				built++
			}
		}
		if built != 1 {
			t.Errorf("%d stores: %d builds wrote progress, want 1 shared build", stores, built)
		}
		checkOneImage(t, s, snap)
		if err := s.Build(ctx, "busybox", nil); !errors.Is(err, image.ErrExists) {
			t.Errorf("build of an existing image: %v, want ErrExists", err)
		}
	}
}

// TestEnsureConcurrentProcesses: Ensures of a missing image in three
// processes at once on one pool (each its own Store and snapshotter on
// the mounted pool, as two servers or a server and arbor image build
// would be) all succeed: builds in separate processes are not shared,
// their build volumes have random names, and the ones that lose the race
// at the final snapshot take the winner's image. This test's binary is
// its own helper process (ARBOR_IMAGE_ENSURE_HELPER).
func TestEnsureConcurrentProcesses(t *testing.T) {
	requireStaticBusybox(t)
	if dir := os.Getenv("ARBOR_IMAGE_ENSURE_HELPER"); dir != "" {
		ensureHelper(t, dir)
		return
	}
	stateDir := t.TempDir()
	if os.Geteuid() != 0 {
		t.Skip("needs root (btrfs pool)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("btrfs-progs not installed: run make deps")
	}
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: stateDir, PoolSize: 8 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snap.Unmount(context.Background()) })
	s := &image.Store{Snap: snap, CacheDir: t.TempDir()}
	syncDir := t.TempDir()
	const helpers = 2
	cmds := make([]*exec.Cmd, helpers)
	outs := make([]bytes.Buffer, helpers)
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run", "^TestEnsureConcurrentProcesses$", "-test.count=1", "-test.v")
		cmds[i].Env = append(os.Environ(), "ARBOR_IMAGE_ENSURE_HELPER="+stateDir, "ARBOR_IMAGE_ENSURE_SYNC="+syncDir,
			"ARBOR_IMAGE_ENSURE_NAME="+string(rune('a'+i)), "ARBOR_IMAGE_CACHE_HELPER="+s.CacheDir)
		cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	// Every helper has opened the pool: all go at once, this process too.
	waitFiles(t, syncDir, "ready-", helpers)
	if err := os.WriteFile(filepath.Join(syncDir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ensure(ctx, "busybox", nil); err != nil {
		t.Errorf("ensure in the test process: %v", err)
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Errorf("helper %d: %v\n%s", i, err, outs[i].String())
		}
	}
	checkOneImage(t, s, snap)
}

// ensureHelper is a helper process of TestEnsureConcurrentProcesses: it
// opens the mounted pool at dir, says it is ready, waits for the go and
// ensures busybox. It leaves the pool mounted (the test process owns it).
func ensureHelper(t *testing.T, dir string) {
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: 8 << 30})
	if err != nil {
		t.Fatal(err)
	}
	syncDir := os.Getenv("ARBOR_IMAGE_ENSURE_SYNC")
	if err := os.WriteFile(filepath.Join(syncDir, "ready-"+os.Getenv("ARBOR_IMAGE_ENSURE_NAME")), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFiles(t, syncDir, "go", 1)
	s := &image.Store{Snap: snap, CacheDir: os.Getenv("ARBOR_IMAGE_CACHE_HELPER")}
	if _, err := s.Ensure(ctx, "busybox", nil); err != nil {
		t.Fatal(err)
	}
}

// waitFiles waits until dir holds n files whose names start with prefix.
func waitFiles(t *testing.T, dir, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
		if len(m) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d %s files in %s", n, prefix, dir)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
