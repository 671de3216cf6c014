package criu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMoveAside: what stands at a ghost directory's path goes aside and
// comes back with its contents; a missing path or parent is left alone;
// a symlink on the way is never followed (it could lead out of the root,
// to the host's own directories).
func TestMoveAside(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	for _, d := range []string{"work/d", "work/e", "host"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "work/d/f"), []byte("new"), 0o644)
	if err := os.MkdirAll(filepath.Join(outside, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	// work/l -> a directory outside the root; work/l/d must not be moved.
	if err := os.Symlink(outside, filepath.Join(root, "work/l")); err != nil {
		t.Fatal(err)
	}
	s, err := moveAside(root, []string{"work/d", "work/missing", "nodir/x", "work/l/d"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.moved) != 1 {
		t.Fatalf("moved %d paths, want 1 (work/d only)", len(s.moved))
	}
	if _, err := os.Stat(filepath.Join(root, "work/d")); !os.IsNotExist(err) {
		t.Errorf("work/d still in place: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "d")); err != nil {
		t.Errorf("the directory behind a symlink was touched: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "work"))
	hidden := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".arbor-aside-") {
			hidden++
		}
	}
	if hidden != 1 {
		t.Errorf("%d aside names in work/, want 1", hidden)
	}
	// CRIU's ghost stands at the path until it removes it: putting back
	// then fails rather than replace it.
	os.Mkdir(filepath.Join(root, "work/d"), 0o700)
	if err := s.putBack(); err == nil {
		t.Error("put back over a directory that stands at the path: no error")
	}
	// The usual order: the ghost is gone, the original comes back whole.
	os.Remove(filepath.Join(root, "work/d"))
	s, err = moveAside(root, []string{"work/e"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.putBack(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "work/e")); err != nil {
		t.Errorf("work/e not back: %v", err)
	}
}

// TestGhostDirsNoRemaps: images without a remap file (the usual dump)
// hold no ghost directory, and reading them costs one failed open.
func TestGhostDirsNoRemaps(t *testing.T) {
	got, err := ghostDirs(t.TempDir())
	if err != nil || got != nil {
		t.Fatalf("ghostDirs of an empty dir: %v %v", got, err)
	}
}
