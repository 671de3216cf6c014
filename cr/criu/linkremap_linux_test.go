package criu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPlaceLinksInRoot: the names placeLinks makes in a restore root are
// resolved in that root. A symlink the agent planted on the way (to a
// host directory, or climbing with ..) leads to the root's own
// directories, never out of it: nothing is linked outside, and
// unplaceLinks removes the links it made where it made them.
func TestPlaceLinksInRoot(t *testing.T) {
	outside := t.TempDir() // a host directory the agent aims at
	for _, tt := range []struct {
		name  string
		plant func(t *testing.T, root string) // the agent's symlinks
		link  string                          // the recorded name
		at    string                          // where it must land, in root ("": nowhere, an error)
	}{
		{"plain", func(*testing.T, string) {}, "work/link_remap.1", "work/link_remap.1"},
		{"symlink to a host dir missing in the root",
			func(t *testing.T, root string) { symlink(t, outside, filepath.Join(root, "work/l")) },
			"work/l/link_remap.1", ""},
		{"symlink to a host dir present in the root",
			func(t *testing.T, root string) {
				symlink(t, outside, filepath.Join(root, "work/l"))
				mkdir(t, filepath.Join(root, outside))
			},
			"work/l/link_remap.1", filepath.Join(outside, "link_remap.1")},
		{"symlink climbing out",
			func(t *testing.T, root string) { symlink(t, "../../../../../../..", filepath.Join(root, "work/up")) },
			"work/up/link_remap.1", "link_remap.1"},
		{"dot dot in the name", func(*testing.T, string) {}, "../../../../../link_remap.1", "link_remap.1"},
		{"relative symlink to the outside's path",
			func(t *testing.T, root string) {
				rel, err := filepath.Rel(filepath.Join(root, "work"), outside)
				if err != nil {
					t.Fatal(err)
				}
				symlink(t, rel, filepath.Join(root, "work/rel"))
			},
			"work/rel/link_remap.1", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, images := t.TempDir(), t.TempDir()
			mkdir(t, filepath.Join(root, "work/d"))
			held := filepath.Join(root, "work/d/kept")
			if err := os.WriteFile(held, []byte("held"), 0o644); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(held, &st); err != nil {
				t.Fatal(err)
			}
			tt.plant(t, root)
			b, _ := json.Marshal([]linkRemap{{Name: tt.link, Ino: st.Ino}})
			if err := os.WriteFile(filepath.Join(images, linksFile), b, 0o644); err != nil {
				t.Fatal(err)
			}

			made, err := placeLinks(images, root)
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("placeLinks of %s made %s outside the root", tt.link, ents[0].Name())
			}
			if tt.at == "" {
				if err == nil {
					unplaceLinks(made)
					t.Fatalf("placeLinks of %s: no error, want one (its directory is not in the root)", tt.link)
				}
				return
			}
			if err != nil {
				t.Fatalf("placeLinks of %s: %v", tt.link, err)
			}
			var lst unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, tt.at), &lst); err != nil || lst.Ino != st.Ino {
				t.Fatalf("placeLinks of %s: nothing links the file at %s in the root (%v)", tt.link, tt.at, err)
			}
			unplaceLinks(made)
			if _, err := os.Lstat(filepath.Join(root, tt.at)); !os.IsNotExist(err) {
				t.Errorf("after unplaceLinks, %s: %v", tt.at, err)
			}
			if _, err := os.Stat(held); err != nil {
				t.Errorf("the held file's own name: %v", err)
			}
		})
	}
}

func symlink(t *testing.T, target, at string) {
	t.Helper()
	if err := os.Symlink(target, at); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
