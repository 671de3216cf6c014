package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStateTreeFollowsNoLink: a state's files are read as the sandbox
// would see them and no symbolic link is followed on the host: a link's
// target is text, a path through a link is refused, ".." stops at the
// tree's root, and a device node is never opened.
func TestStateTreeFollowsNoLink(t *testing.T) {
	outside := t.TempDir()
	const secret = "outside-the-tree-7d2a"
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "plain"), []byte("text\n"), 0o644))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "abs")))
	must(os.Symlink("../../../../../../.."+outside+"/secret", filepath.Join(root, "rel")))
	must(os.Symlink(outside, filepath.Join(root, "dirlink")))
	dev := unix.Geteuid() == 0 && unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) == nil

	tr, err := openStateTree(root)
	must(err)
	defer tr.Close()
	for _, tt := range []struct {
		name, path string
		want       entry
		readable   bool
	}{
		{"file", "/plain", entry{Exists: true, Type: "file", Size: 5}, true},
		{"absolute link", "/abs", entry{Exists: true, Type: "symlink", Size: int64(len(outside + "/secret")), Link: outside + "/secret"}, false},
		{"relative link", "/rel", entry{Exists: true, Type: "symlink", Size: int64(len("../../../../../../.." + outside + "/secret")), Link: "../../../../../../.." + outside + "/secret"}, false},
		{"through a link", "/dirlink/secret", entry{Exists: true, Type: "other", Through: true}, false},
		{"dot-dot stays in the tree", "/../../../../" + outside + "/secret", entry{}, false},
		{"missing", "/nope", entry{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tr.stat(tt.path)
			if err != nil || got != tt.want {
				t.Errorf("stat %s: %+v %v, want %+v", tt.path, got, err, tt.want)
			}
			b, _, err := tr.read(tt.path, 1<<20)
			if strings.Contains(string(b), secret) || tt.readable != (err == nil) {
				t.Errorf("read %s: %q %v", tt.path, b, err)
			}
		})
	}
	if dev {
		if e, err := tr.stat("/null"); err != nil || e.Type != "other" {
			t.Errorf("a device node: %+v %v", e, err)
		}
		if _, _, err := tr.read("/null", 10); err == nil {
			t.Error("a device node was read")
		}
	}
}
