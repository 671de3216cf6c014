// Package crtest is the conformance suite every cr.Snapshotter backend
// runs: the same tests and benchmarks for btrfs and zfs, so that a caller
// can switch backends without noticing. A backend's own _test.go calls Run
// and Bench with a constructor that skips when the host cannot run it.
package crtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/arbor-env/arbor/cr"
)

// NewFunc returns a snapshotter with no volumes in it, cleaned up by tb.
type NewFunc func(tb testing.TB) cr.Snapshotter

// Run runs the conformance tests, each against a fresh snapshotter.
func Run(t *testing.T, newSnapshotter NewFunc) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s cr.Snapshotter)
	}{
		{"CreateVolume", testCreateVolume},
		{"SnapshotIsReadOnlyAndPointInTime", testSnapshot},
		{"CloneIsWritableAndIndependent", testClone},
		{"Destroy", testDestroy},
		{"DestroyKeepsDependents", testDestroyKeepsDependents},
		{"NotFound", testNotFound},
		{"Exists", testExists},
		{"InvalidNames", testInvalidNames},
		{"ListByPrefix", testList},
		{"Changes", testChanges},
		{"CloneWithQuotaRefusesWritesPastIt", testQuota},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newSnapshotter(t))
		})
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(t, os.WriteFile(path, []byte(content), 0o644))
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantFile fails the test unless the file at path holds want; what says
// what the check is about.
func wantFile(t testing.TB, path, want, what string) {
	t.Helper()
	if got := readFile(t, path); got != want {
		t.Fatalf("%s: %s = %q, want %q", what, path, got, want)
	}
}

func assertMissing(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: want it missing, got err %v", path, err)
	}
}

func find(vols []cr.Volume, name string) (cr.Volume, bool) {
	for _, v := range vols {
		if v.Name == name {
			return v, true
		}
	}
	return cr.Volume{}, false
}

func testCreateVolume(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	for _, name := range []string{"v", "images/busybox", "a/b/c/d"} {
		must(t, s.CreateVolume(ctx, name))
		writeFile(t, filepath.Join(s.Path(name), "f"), name)
		wantFile(t, filepath.Join(s.Path(name), "f"), name, name)
		if ents, _ := os.ReadDir(s.Path(name)); len(ents) != 1 {
			t.Fatalf("%s: new volume not empty: %v", name, ents)
		}
	}
	vols, err := s.List(ctx, "")
	must(t, err)
	for _, name := range []string{"v", "images/busybox", "a/b/c/d"} {
		v, ok := find(vols, name)
		if !ok || v.ReadOnly {
			t.Fatalf("List: %s missing or read-only in %+v", name, vols)
		}
	}
	if len(vols) != 3 {
		t.Fatalf("List: want 3 volumes, got %+v", vols)
	}
}

func testSnapshot(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	must(t, s.CreateVolume(ctx, "vol"))
	writeFile(t, filepath.Join(s.Path("vol"), "a"), "one")
	writeFile(t, filepath.Join(s.Path("vol"), "d/b"), "bee")
	must(t, s.Snapshot(ctx, "vol", "snaps/s1"))

	writeFile(t, filepath.Join(s.Path("vol"), "a"), "two")
	writeFile(t, filepath.Join(s.Path("vol"), "new"), "x")
	must(t, os.Remove(filepath.Join(s.Path("vol"), "d/b")))

	snap := s.Path("snaps/s1")
	wantFile(t, filepath.Join(snap, "a"), "one", "snapshot saw a later write")
	wantFile(t, filepath.Join(snap, "d/b"), "bee", "snapshot lost d/b")
	assertMissing(t, filepath.Join(snap, "new"))
	if err := os.WriteFile(filepath.Join(snap, "a"), []byte("w"), 0o644); err == nil {
		t.Fatal("wrote into a read-only snapshot")
	}
	if err := os.WriteFile(filepath.Join(snap, "created"), []byte("w"), 0o644); err == nil {
		t.Fatal("created a file in a read-only snapshot")
	}
	vols, err := s.List(ctx, "snaps/")
	must(t, err)
	v, ok := find(vols, "snaps/s1")
	if !ok || !v.ReadOnly {
		t.Fatalf("List: want snaps/s1 read-only, got %+v", vols)
	}
	if v.Parent != "" && v.Parent != "vol" {
		t.Fatalf("List: snaps/s1 parent %q, want vol", v.Parent)
	}
	// A snapshot of a snapshot is allowed too.
	must(t, s.Snapshot(ctx, "snaps/s1", "snaps/s2"))
	wantFile(t, filepath.Join(s.Path("snaps/s2"), "a"), "one", "snapshot of snapshot")
}

func testClone(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	must(t, s.CreateVolume(ctx, "vol"))
	writeFile(t, filepath.Join(s.Path("vol"), "a"), "base")
	must(t, s.Snapshot(ctx, "vol", "snap"))
	tests := []struct {
		name string
		src  string
	}{
		{"FromSnapshot", "snap"},
		{"FromVolume", "vol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := "clones/" + tt.name
			must(t, s.Clone(ctx, tt.src, dst))
			c, src := s.Path(dst), s.Path(tt.src)
			wantFile(t, filepath.Join(c, "a"), "base", "clone")
			writeFile(t, filepath.Join(c, "a"), "clone")
			writeFile(t, filepath.Join(c, "only-clone"), "c")
			wantFile(t, filepath.Join(src, "a"), "base", "clone write leaked into source")
			assertMissing(t, filepath.Join(src, "only-clone"))
			if tt.src == "vol" {
				writeFile(t, filepath.Join(src, "only-src"), "s")
				assertMissing(t, filepath.Join(c, "only-src"))
				must(t, os.Remove(filepath.Join(src, "only-src")))
			}
			vols, err := s.List(ctx, dst)
			must(t, err)
			if v, ok := find(vols, dst); !ok || v.ReadOnly {
				t.Fatalf("List: want writable %s, got %+v", dst, vols)
			}
		})
	}
	// Two clones of one snapshot are independent of each other.
	must(t, s.Clone(ctx, "snap", "c1"))
	must(t, s.Clone(ctx, "snap", "c2"))
	writeFile(t, filepath.Join(s.Path("c1"), "a"), "c1")
	wantFile(t, filepath.Join(s.Path("c2"), "a"), "base", "sibling clone saw a write")
}

func testDestroy(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	for _, name := range []string{"v", "deep/er/v"} {
		must(t, s.CreateVolume(ctx, name))
		writeFile(t, filepath.Join(s.Path(name), "f"), "x")
		must(t, s.Snapshot(ctx, name, name+"-snap"))
		must(t, s.Destroy(ctx, name+"-snap"))
		must(t, s.Destroy(ctx, name))
		assertMissing(t, filepath.Join(s.Path(name), "f"))
		if err := s.Destroy(ctx, name); !errors.Is(err, cr.ErrNotFound) {
			t.Fatalf("second destroy of %s: want ErrNotFound, got %v", name, err)
		}
	}
	vols, err := s.List(ctx, "")
	must(t, err)
	if len(vols) != 0 {
		t.Fatalf("List after destroy: %+v", vols)
	}
	// A name freed by Destroy can be used again, and so can its parent.
	must(t, s.CreateVolume(ctx, "deep/er/v"))
	must(t, s.Destroy(ctx, "deep/er/v"))
	must(t, s.CreateVolume(ctx, "deep"))
}

func testDestroyKeepsDependents(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	must(t, s.CreateVolume(ctx, "vol"))
	writeFile(t, filepath.Join(s.Path("vol"), "a"), "v1")
	must(t, s.Snapshot(ctx, "vol", "s1"))
	must(t, s.Clone(ctx, "s1", "c1"))
	must(t, s.Clone(ctx, "vol", "c2"))
	writeFile(t, filepath.Join(s.Path("vol"), "a"), "v2")
	must(t, s.Snapshot(ctx, "vol", "s2"))
	must(t, s.Clone(ctx, "s2", "c3"))

	// Destroy the volume first, then a snapshot with a clone, then the rest
	// in an order where every destroy has live dependents.
	steps := []struct {
		name    string
		destroy string
		check   map[string]string // volume -> content of a
	}{
		{"Volume", "vol", map[string]string{"s1": "v1", "s2": "v2", "c1": "v1", "c2": "v1", "c3": "v2"}},
		{"SnapshotWithClone", "s1", map[string]string{"s2": "v2", "c1": "v1", "c2": "v1", "c3": "v2"}},
		{"Clone", "c3", map[string]string{"s2": "v2", "c1": "v1", "c2": "v1"}},
		{"Snapshot", "s2", map[string]string{"c1": "v1", "c2": "v1"}},
		{"LastClones", "c1", map[string]string{"c2": "v1"}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			must(t, s.Destroy(ctx, st.destroy))
			assertMissing(t, filepath.Join(s.Path(st.destroy), "a"))
			for v, want := range st.check {
				wantFile(t, filepath.Join(s.Path(v), "a"), want, "after destroying "+st.destroy)
			}
			vols, err := s.List(ctx, "")
			must(t, err)
			if len(vols) != len(st.check) {
				t.Fatalf("List: want %d, got %+v", len(st.check), vols)
			}
		})
	}
	must(t, s.Destroy(ctx, "c2"))
}

func testNotFound(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	must(t, s.CreateVolume(ctx, "vol"))
	must(t, s.Snapshot(ctx, "vol", "snap"))
	must(t, s.CreateVolume(ctx, "dir/v"))
	wantErr(t, cr.ErrNotFound, []errCase{
		{"Snapshot", func() error { return s.Snapshot(ctx, "missing", "x") }},
		{"Clone", func() error { return s.Clone(ctx, "missing", "x") }},
		{"Destroy", func() error { return s.Destroy(ctx, "missing") }},
		{"DestroyParentDirectory", func() error { return s.Destroy(ctx, "dir") }},
		{"ChangesBase", func() error { _, err := s.Changes(ctx, "missing", "vol"); return err }},
		{"ChangesTarget", func() error { _, err := s.Changes(ctx, "snap", "missing"); return err }},
	})
}

// errCase is an operation expected to fail, named for its subtest.
type errCase struct {
	name string
	op   func() error
}

// wantErr runs each case as a subtest and wants its error to wrap want.
func wantErr(t *testing.T, want error, cases []errCase) {
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.op(); !errors.Is(err, want) {
				t.Fatalf("want %q, got %v", want, err)
			}
		})
	}
}

func testExists(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	must(t, s.CreateVolume(ctx, "vol"))
	must(t, s.Snapshot(ctx, "vol", "snap"))
	must(t, s.CreateVolume(ctx, "dir/v"))
	wantErr(t, cr.ErrExists, []errCase{
		{"CreateVolume", func() error { return s.CreateVolume(ctx, "vol") }},
		{"CreateOverSnapshot", func() error { return s.CreateVolume(ctx, "snap") }},
		{"CreateOverParentDirectory", func() error { return s.CreateVolume(ctx, "dir") }},
		{"Snapshot", func() error { return s.Snapshot(ctx, "vol", "snap") }},
		{"Clone", func() error { return s.Clone(ctx, "snap", "vol") }},
	})
}

func testInvalidNames(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	must(t, s.CreateVolume(ctx, "vol"))
	tests := []struct {
		name, vol string
	}{
		{"Empty", ""},
		{"Absolute", "/abs"},
		{"DotDot", "a/../b"},
		{"Hidden", ".hidden"},
		{"TrailingSlash", "a/"},
		{"Space", "a b"},
		{"InsideVolume", "vol/inner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.CreateVolume(ctx, tt.vol); !errors.Is(err, cr.ErrInvalidName) {
				t.Fatalf("CreateVolume(%q): want ErrInvalidName, got %v", tt.vol, err)
			}
			if err := s.Clone(ctx, "vol", tt.vol); !errors.Is(err, cr.ErrInvalidName) {
				t.Fatalf("Clone to %q: want ErrInvalidName, got %v", tt.vol, err)
			}
		})
	}
}

func testList(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	names := []string{"images/busybox", "images/debian", "imagesx", "sandboxes/a/root", "sandboxes/b/root"}
	for _, n := range names {
		must(t, s.CreateVolume(ctx, n))
	}
	must(t, s.Snapshot(ctx, "images/busybox", "images/busybox-ro"))
	tests := []struct {
		name, prefix string
		want         []string
	}{
		{"All", "", append(slices.Clone(names), "images/busybox-ro")},
		{"Directory", "images/", []string{"images/busybox", "images/busybox-ro", "images/debian"}},
		{"NamePrefix", "images", []string{"images/busybox", "images/busybox-ro", "images/debian", "imagesx"}},
		{"Deep", "sandboxes/b", []string{"sandboxes/b/root"}},
		{"Exact", "images/busybox", []string{"images/busybox", "images/busybox-ro"}},
		{"None", "nothing", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vols, err := s.List(ctx, tt.prefix)
			must(t, err)
			var got []string
			for _, v := range vols {
				got = append(got, v.Name)
			}
			slices.Sort(got)
			slices.Sort(tt.want)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("List(%q) = %v, want %v", tt.prefix, got, tt.want)
			}
		})
	}
}

// changeCase prepares a tree, snapshots it, changes it and expects Changes
// to report want.
type changeCase struct {
	name   string
	setup  func(t testing.TB, dir string)
	mutate func(t testing.TB, dir string)
	want   []cr.Change
}

func baseTree(t testing.TB, dir string) {
	writeFile(t, filepath.Join(dir, "keep"), "keep")
	writeFile(t, filepath.Join(dir, "file"), "content")
	writeFile(t, filepath.Join(dir, "d/inner"), "inner")
	writeFile(t, filepath.Join(dir, "d/sub/deep"), "deep")
	must(t, os.Symlink("file", filepath.Join(dir, "link")))
}

var changeCases = []changeCase{
	{name: "NoChange", mutate: func(t testing.TB, dir string) { readFile(t, filepath.Join(dir, "file")) }},
	{name: "AddFile", mutate: func(t testing.TB, dir string) { writeFile(t, filepath.Join(dir, "new"), "n") },
		want: []cr.Change{{Path: "/new", Kind: cr.Added}}},
	{name: "AddDirWithFile", mutate: func(t testing.TB, dir string) { writeFile(t, filepath.Join(dir, "nd/f"), "n") },
		want: []cr.Change{{Path: "/nd", Kind: cr.Added}, {Path: "/nd/f", Kind: cr.Added}}},
	{name: "ModifyContent", mutate: func(t testing.TB, dir string) { writeFile(t, filepath.Join(dir, "d/inner"), "INNER") },
		want: []cr.Change{{Path: "/d/inner", Kind: cr.Modified}}},
	{name: "Append", mutate: func(t testing.TB, dir string) {
		f, err := os.OpenFile(filepath.Join(dir, "file"), os.O_APPEND|os.O_WRONLY, 0)
		must(t, err)
		_, err = f.WriteString("more")
		must(t, err)
		must(t, f.Close())
	}, want: []cr.Change{{Path: "/file", Kind: cr.Modified}}},
	{name: "Chmod", mutate: func(t testing.TB, dir string) { must(t, os.Chmod(filepath.Join(dir, "keep"), 0o600)) },
		want: []cr.Change{{Path: "/keep", Kind: cr.Modified}}},
	{name: "ChmodDir", mutate: func(t testing.TB, dir string) { must(t, os.Chmod(filepath.Join(dir, "d"), 0o700)) },
		want: []cr.Change{{Path: "/d", Kind: cr.Modified}}},
	{name: "Chown", mutate: func(t testing.TB, dir string) { must(t, os.Lchown(filepath.Join(dir, "keep"), 1234, 1234)) },
		want: []cr.Change{{Path: "/keep", Kind: cr.Modified}}},
	{name: "DeleteFile", mutate: func(t testing.TB, dir string) { must(t, os.Remove(filepath.Join(dir, "file"))) },
		want: []cr.Change{{Path: "/file", Kind: cr.Deleted}}},
	{name: "DeleteTree", mutate: func(t testing.TB, dir string) { must(t, os.RemoveAll(filepath.Join(dir, "d"))) },
		want: []cr.Change{{Path: "/d", Kind: cr.Deleted}, {Path: "/d/inner", Kind: cr.Deleted},
			{Path: "/d/sub", Kind: cr.Deleted}, {Path: "/d/sub/deep", Kind: cr.Deleted}}},
	{name: "CreatedThenDeleted", mutate: func(t testing.TB, dir string) {
		writeFile(t, filepath.Join(dir, "tmp/transient"), "t")
		must(t, os.RemoveAll(filepath.Join(dir, "tmp")))
		writeFile(t, filepath.Join(dir, "d/transient"), "t")
		must(t, os.Remove(filepath.Join(dir, "d/transient")))
	}},
	{name: "RenameFile", mutate: func(t testing.TB, dir string) {
		must(t, os.Rename(filepath.Join(dir, "file"), filepath.Join(dir, "d/renamed")))
	}, want: []cr.Change{{Path: "/d/renamed", Kind: cr.Added}, {Path: "/file", Kind: cr.Deleted}}},
	{name: "RenameOverExisting", mutate: func(t testing.TB, dir string) {
		must(t, os.Rename(filepath.Join(dir, "file"), filepath.Join(dir, "keep")))
	}, want: []cr.Change{{Path: "/file", Kind: cr.Deleted}, {Path: "/keep", Kind: cr.Modified}}},
	{name: "RenameDir", mutate: func(t testing.TB, dir string) {
		must(t, os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "e")))
	}, want: []cr.Change{{Path: "/d", Kind: cr.Deleted}, {Path: "/d/inner", Kind: cr.Deleted},
		{Path: "/d/sub", Kind: cr.Deleted}, {Path: "/d/sub/deep", Kind: cr.Deleted},
		{Path: "/e", Kind: cr.Added}, {Path: "/e/inner", Kind: cr.Added},
		{Path: "/e/sub", Kind: cr.Added}, {Path: "/e/sub/deep", Kind: cr.Added}}},
	{name: "RetargetSymlink", mutate: func(t testing.TB, dir string) {
		must(t, os.Remove(filepath.Join(dir, "link")))
		must(t, os.Symlink("keep", filepath.Join(dir, "link")))
	}, want: []cr.Change{{Path: "/link", Kind: cr.Modified}}},
	{name: "ReplaceFileWithDir", mutate: func(t testing.TB, dir string) {
		must(t, os.Remove(filepath.Join(dir, "keep")))
		must(t, os.Mkdir(filepath.Join(dir, "keep"), 0o755))
	}, want: []cr.Change{{Path: "/keep", Kind: cr.Modified}}},
	{name: "HardLink", mutate: func(t testing.TB, dir string) {
		must(t, os.Link(filepath.Join(dir, "keep"), filepath.Join(dir, "d/hard")))
	}, want: []cr.Change{{Path: "/d/hard", Kind: cr.Added}}},
	{name: "TouchMtime", mutate: func(t testing.TB, dir string) {
		must(t, os.Chtimes(filepath.Join(dir, "keep"), time0, time0))
	}, want: []cr.Change{{Path: "/keep", Kind: cr.Modified}}},
}

func testChanges(t *testing.T, s cr.Snapshotter) {
	ctx := t.Context()
	for i, tc := range changeCases {
		t.Run(tc.name, func(t *testing.T) {
			vol := fmt.Sprintf("changes/%d", i)
			must(t, s.CreateVolume(ctx, vol))
			baseTree(t, s.Path(vol))
			must(t, s.Snapshot(ctx, vol, vol+"-base"))
			tc.mutate(t, s.Path(vol))
			checkChanges(t, s, ctx, vol+"-base", vol, tc.want)
			// Against a snapshot of the result, and in the other direction.
			must(t, s.Snapshot(ctx, vol, vol+"-after"))
			checkChanges(t, s, ctx, vol+"-base", vol+"-after", tc.want)
		})
	}
}

func checkChanges(t *testing.T, s cr.Snapshotter, ctx context.Context, base, target string, want []cr.Change) {
	t.Helper()
	got, err := s.Changes(ctx, base, target)
	must(t, err)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Changes(%s, %s) =\n  %v\nwant\n  %v", base, target, got, want)
	}
}
