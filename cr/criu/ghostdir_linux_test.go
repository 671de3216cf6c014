package criu

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestClash: a ghost path clashes only where something stands at it, its
// parent is reached without following symlinks (a symlink could lead out
// of the root, to the host's own directories).
func TestClash(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	for _, d := range []string{"work/d", "work/e"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(outside, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "work/l")); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for p, want := range map[string]bool{"work/d": true, "work/missing": false, "nodir/x": false, "work/l/d": false} {
		parent, _, err := clash(fd, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if got := parent != nil; got != want {
			t.Errorf("%s: clash %v, want %v", p, got, want)
		}
		if parent != nil {
			parent.Close()
		}
	}
}

// TestSwap: after the swap the ghost is gone from both names but for an
// empty directory at its hidden name (CRIU removes that), the tree's own
// directory is back at the path with its contents, and a process holding
// the ghost sees it deleted at the path.
func TestSwap(t *testing.T) {
	root := t.TempDir()
	work := filepath.Join(root, "work")
	for _, d := range []string{"d", ".arbor-ghost-x"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(work, "d/f"), []byte("new"), 0o644)
	held, err := os.Open(filepath.Join(work, ".arbor-ghost-x")) // as a restored cwd holds it
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	parent, err := os.Open(work)
	if err != nil {
		t.Fatal(err)
	}
	p := &ghostPlan{swaps: []ghostSwap{{parent: parent, name: "d", ghost: ".arbor-ghost-x"}}}
	defer p.close()
	if err := p.swap(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(work, "d/f")); err != nil || string(b) != "new" {
		t.Errorf("the tree's directory after the swap: %q %v", b, err)
	}
	if ents, err := os.ReadDir(filepath.Join(work, ".arbor-ghost-x")); err != nil || len(ents) != 0 {
		t.Errorf("hidden name after the swap: %v %v, want an empty directory", ents, err)
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(held.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(work, "d") + " (deleted)"; link != want {
		t.Errorf("the held ghost reads %q, want %q", link, want)
	}
	ents, _ := os.ReadDir(work)
	if len(ents) != 2 {
		t.Errorf("work/ holds %v, want d and the hidden name only", ents)
	}
}

// TestReadGhostsNoRemaps: images without a remap file (the usual dump)
// hold no ghost, and reading them costs one failed open.
func TestReadGhostsNoRemaps(t *testing.T) {
	got, err := readGhosts(t.TempDir())
	if err != nil || got != nil {
		t.Fatalf("readGhosts of an empty dir: %+v %v", got, err)
	}
}
