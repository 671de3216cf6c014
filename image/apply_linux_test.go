package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	xattrs           map[string]string
}

func layerTar(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.gid,
			ModTime: time.Unix(1600000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// tree lists a directory tree as "path type[ -> target| = body]" lines.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		fi, _ := d.Info()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out = append(out, rel+" -> "+l)
		case fi.IsDir():
			out = append(out, rel+"/")
		default:
			b, _ := os.ReadFile(p)
			out = append(out, rel+" = "+string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestApplyLayerChangesets: layers applied in order give exactly the tree
// the OCI image spec's changeset rules define (image-spec layer.md:
// additions, replacements, whiteouts, opaque whiteouts, hard links).
func TestApplyLayerChangesets(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	ctx := context.Background()
	layers := [][]entry{
		{
			{name: "etc/", typ: tar.TypeDir},
			{name: "etc/keep", body: "k"},
			{name: "etc/gone", body: "g"},
			{name: "opq/", typ: tar.TypeDir},
			{name: "opq/old", body: "o"},
			{name: "opq/sub/", typ: tar.TypeDir},
			{name: "opq/sub/deep", body: "d"},
			{name: "dir2file/", typ: tar.TypeDir},
			{name: "dir2file/x", body: "x"},
			{name: "link", typ: tar.TypeSymlink, link: "etc/keep"},
			{name: "bin/", typ: tar.TypeDir},
			{name: "bin/tool", body: "v1", mode: 0o4755},
			{name: "bin/tool2", typ: tar.TypeLink, link: "bin/tool"},
			{name: "gonedir/", typ: tar.TypeDir},
			{name: "gonedir/f", body: "f"},
		},
		{
			{name: "etc/", typ: tar.TypeDir},
			{name: "etc/.wh.gone", body: ""},
			{name: ".wh.gonedir"},
			{name: "opq/.wh..wh..opq"},
			{name: "opq/new", body: "n"},
			{name: "dir2file", body: "now a file"},
			{name: "link", body: "link replaced by a file"},
			// A whiteout of this layer's own entry is no whiteout of it.
			{name: "fresh", body: "mine"},
			{name: ".wh.fresh"},
			// implicit parent directories
			{name: "a/b/c", body: "abc"},
			{name: "bin/tool", body: "v2", mode: 0o755},
		},
	}
	for i, l := range layers {
		if _, err := ApplyTar(ctx, root, bytes.NewReader(layerTar(t, l...))); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
	want := []string{
		"a/", "a/b/", "a/b/c = abc",
		"bin/", "bin/tool = v2", "bin/tool2 = v1",
		"dir2file = now a file",
		"etc/", "etc/keep = k",
		"fresh = mine",
		"link = link replaced by a file",
		"opq/", "opq/new = n",
	}
	if got := tree(t, root); !slices.Equal(got, want) {
		t.Errorf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// bin/tool was replaced, not written through: its old hard link
	// keeps the old content and the set-uid bit.
	st, err := os.Stat(filepath.Join(root, "bin/tool2"))
	if err != nil || st.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("bin/tool2: %v, mode %v; want the set-uid v1", err, st.Mode())
	}
	if st, _ := os.Stat(filepath.Join(root, "bin/tool")); st.Mode().Perm() != 0o755 || st.Mode()&fs.ModeSetuid != 0 {
		t.Errorf("bin/tool mode %v, want 0755", st.Mode())
	}
	if mt := mustStat(t, filepath.Join(root, "etc")).ModTime(); !mt.Equal(time.Unix(1600000000, 0)) {
		t.Errorf("etc mtime %v: a directory's time is set after its entries", mt)
	}
}

func mustStat(t *testing.T, p string) fs.FileInfo {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestApplyLayerOwnersAndXattrs: numeric owners, modes and file
// capabilities (security.capability) are kept.
func TestApplyLayerOwnersAndXattrs(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	// cap_net_raw+ep as a v2 vfs_cap_data, as ping ships.
	capNetRaw := string([]byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	_, err := ApplyTar(context.Background(), root, bytes.NewReader(layerTar(t,
		entry{name: "home/app/", typ: tar.TypeDir, uid: 1000, gid: 1001, mode: 0o750},
		entry{name: "home/app/f", body: "x", uid: 1000, gid: 1001, mode: 0o600},
		entry{name: "ping", body: "elf", mode: 0o755, xattrs: map[string]string{"security.capability": capNetRaw}},
		entry{name: "fifo", typ: tar.TypeFifo, mode: 0o640},
	)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p        string
		uid, gid uint32
		mode     fs.FileMode
	}{{"home/app", 1000, 1001, fs.ModeDir | 0o750}, {"home/app/f", 1000, 1001, 0o600}, {"fifo", 0, 0, fs.ModeNamedPipe | 0o640}} {
		st := mustStat(t, filepath.Join(root, c.p))
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != c.uid || sys.Gid != c.gid || st.Mode() != c.mode {
			t.Errorf("%s: %d:%d %v, want %d:%d %v", c.p, sys.Uid, sys.Gid, st.Mode(), c.uid, c.gid, c.mode)
		}
	}
	got, err := getCaps(filepath.Join(root, "ping"))
	if err != nil || string(got) != capNetRaw {
		t.Errorf("ping's security.capability %x (%v), want %x", got, err, capNetRaw)
	}
}

// TestApplyLayerHostile: what a hostile image would try to reach outside
// its root stays inside it or is refused; nothing outside root changes.
func TestApplyLayerHostile(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name    string
		layer   []entry
		wantErr error    // nil: applies, and stays inside
		inside  []string // files that must exist inside root afterwards
		absent  []string // and files that must not
	}{
		{name: "dot-dot path", layer: []entry{{name: "../../../outside-dotdot", body: "x"}}, inside: []string{"outside-dotdot"}},
		{name: "absolute path", layer: []entry{{name: "/outside-abs", body: "x"}}, inside: []string{"outside-abs"}},
		{name: "through an absolute symlink", layer: []entry{
			{name: "escape", typ: tar.TypeSymlink, link: "/"},
			{name: "escape/outside-sym", body: "x"},
		}, inside: []string{"outside-sym"}},
		{name: "through a relative symlink up", layer: []entry{
			{name: "d/", typ: tar.TypeDir},
			{name: "d/up", typ: tar.TypeSymlink, link: "../../../../.."},
			{name: "d/up/outside-rel", body: "x"},
		}, inside: []string{"outside-rel"}},
		{name: "replacing a symlink does not write through it", layer: []entry{
			{name: "victim", typ: tar.TypeSymlink, link: "/outside-victim"},
			{name: "victim", body: "replaced"},
		}, inside: []string{"victim"}},
		{name: "hard link out of the root", layer: []entry{
			{name: "secret", body: "inside"},
			{name: "hl", typ: tar.TypeLink, link: "../../../../secret"},
		}, inside: []string{"hl"}},
		{name: "char device", layer: []entry{{name: "opt/mem", typ: tar.TypeChar, mode: 0o666}}, wantErr: ErrBadLayer},
		{name: "char device under /dev is left out", layer: []entry{{name: "dev/", typ: tar.TypeDir}, {name: "dev/mem", typ: tar.TypeChar, mode: 0o666}, {name: "dev/ok", body: "x"}},
			inside: []string{"dev/ok"}, absent: []string{"dev/mem"}},
		{name: "block device", layer: []entry{{name: "sda", typ: tar.TypeBlock}}, wantErr: ErrBadLayer},
		{name: "whiteout of the parent", layer: []entry{{name: "a/.wh..."}}, wantErr: ErrBadLayer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outer := t.TempDir()
			root := filepath.Join(outer, "a", "b", "root")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			before := tree(t, outer)
			_, err := ApplyTar(context.Background(), root, bytes.NewReader(layerTar(t, tt.layer...)))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			for _, p := range tt.inside {
				if _, err := os.Lstat(filepath.Join(root, p)); err != nil {
					t.Errorf("%s not inside the root: %v", p, err)
				}
			}
			for _, p := range tt.absent {
				if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
					t.Errorf("%s made", p)
				}
			}
			var outside []string
			for _, l := range tree(t, outer) {
				if !strings.HasPrefix(l, "a/b/root/") && !slices.Contains(before, l) {
					outside = append(outside, l)
				}
			}
			if len(outside) > 0 {
				t.Errorf("written outside the root: %v", outside)
			}
			for _, p := range []string{"/outside-dotdot", "/outside-abs", "/outside-sym", "/outside-rel", "/outside-victim"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s made on the host", p)
				}
			}
		})
	}
}

// TestApplyLayerTruncated: a tar stream cut short is a bad layer.
func TestApplyLayerTruncated(t *testing.T) {
	requireRoot(t)
	b := layerTar(t, entry{name: "big", body: strings.Repeat("x", 10000)})
	_, err := ApplyTar(context.Background(), t.TempDir(), bytes.NewReader(b[:3000]))
	if !errors.Is(err, ErrBadLayer) {
		t.Fatalf("err %v, want ErrBadLayer", err)
	}
}
