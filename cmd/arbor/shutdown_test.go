package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// mountsBelow lists the mount points at or below dir.
func mountsBelow(dir string) []string {
	var points []string
	for _, m := range servetest.MountsBelow(dir) {
		points = append(points, m.Point)
	}
	return points
}

// loopsOf lists the loop devices backed by file.
func loopsOf(t *testing.T, file string) []string {
	t.Helper()
	backs, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var loops []string
	for _, p := range backs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == file {
			loops = append(loops, strings.Split(p, "/")[3])
		}
	}
	return loops
}

// TestServeUnmountsOnStop runs the real `arbor serve` on a state dir of
// its own (not on btrfs, so the pool is a loop-mounted file), makes an
// env and a checkpoint, and stops it with SIGTERM: it exits cleanly and
// leaves nothing mounted below the state dir (no pool, no tmpfs of hot
// images) and no loop device on the pool file; the images the tmpfs held
// were moved to disk.
func TestServeUnmountsOnStop(t *testing.T) {
	servetest.RequireHost(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	srv, c := startServe(t, ctx, dir, servetest.FreeAddr(t))
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	step(t, ctx, c, r.EnvID, "echo x > /x")
	if _, err := c.States(ctx, r.EnvID); err != nil { // waits for the checkpoint
		t.Fatal(err)
	}
	c.Close()
	pool := filepath.Join(dir, "pool")
	hot := filepath.Join(dir, "engine", "images", "hot")
	before := mountsBelow(dir)
	for _, want := range []string{pool, hot} {
		if !strings.Contains(strings.Join(before, " "), want) {
			t.Fatalf("while serving, mounts below the state dir are %v: want %s among them", before, want)
		}
	}
	if len(loopsOf(t, filepath.Join(dir, "pool.img"))) == 0 {
		t.Fatal("while serving, no loop device backs the pool file")
	}

	if err := srv.Stop(2 * time.Minute); err != nil {
		t.Fatalf("arbor serve after SIGTERM: %v", err)
	}
	if after := mountsBelow(dir); len(after) != 0 {
		t.Errorf("after a clean stop, still mounted below the state dir: %v (before: %v)", after, before)
	}
	// The kernel frees an autoclear loop device after its last user is
	// gone, asynchronously.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		loops := loopsOf(t, filepath.Join(dir, "pool.img"))
		if len(loops) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after a clean stop, loop devices %v still back the pool file", loops)
			break
		}
	}
	if left, _ := os.ReadDir(hot); len(left) != 0 {
		t.Errorf("the hot image folder holds %d entries under the tmpfs it had", len(left))
	}
	cold, err := os.ReadDir(filepath.Join(dir, "engine", "images", "cold"))
	if err != nil || len(cold) == 0 {
		t.Errorf("no process image on disk after the stop (%v): the tmpfs's images were lost", err)
	}
}
