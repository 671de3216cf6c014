package image

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: shifting changes file owners")
	}
}

func owner(t *testing.T, p string) (uint32, uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid, st.Mode & 0o7777
}

func TestShift(t *testing.T) {
	requireRoot(t)
	const base, size = 1 << 30, 65536
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	mustMkdir(t, filepath.Join(dir, "home/u"))
	files := map[string]struct{ uid, gid, mode int }{
		"plain":   {0, 0, 0o644},
		"suid":    {0, 0, 0o4755},
		"sgid":    {0, 42, 0o2755},
		"home/u":  {1000, 1000, 0o700},
		"nobody":  {65534, 65534, 0o600},
		"shifted": {base + 5, base + 5, 0o644}, // already in the range
	}
	for name, f := range files {
		p := filepath.Join(dir, name)
		if name != "home/u" {
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Lchown(p, f.uid, f.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, os.FileMode(f.mode&0o777)|modeBits(f.mode)); err != nil {
			t.Fatal(err)
		}
	}
	mustSymlink(t, "plain", filepath.Join(dir, "link"))
	if err := os.Lchown(filepath.Join(dir, "link"), 7, 7); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "plain"), filepath.Join(dir, "hardlink")); err != nil {
		t.Fatal(err)
	}
	// cap_net_raw+ep as setcap writes it (version 2).
	v2 := make([]byte, 20)
	binary.LittleEndian.PutUint32(v2[0:], 0x02000001)
	binary.LittleEndian.PutUint32(v2[4:], 1<<13)
	capFile := filepath.Join(dir, "ping")
	os.WriteFile(capFile, []byte("x"), 0o755)
	capsOK := unix.Setxattr(capFile, capXattr, v2, 0) == nil

	if err := Shift(dir, base, size); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name           string
		uid, gid, mode uint32
	}{
		{".", base, base, 0o755},
		{"plain", base, base, 0o644},
		{"hardlink", base, base, 0o644},
		{"suid", base, base, 0o4755},
		{"sgid", base, base + 42, 0o2755},
		{"home/u", base + 1000, base + 1000, 0o700},
		{"nobody", base + 65534, base + 65534, 0o600},
		{"shifted", base + 5, base + 5, 0o644},
		{"link", base + 7, base + 7, 0o777},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uid, gid, mode := owner(t, filepath.Join(dir, tt.name))
			if uid != tt.uid || gid != tt.gid || mode != tt.mode {
				t.Errorf("%d:%d mode %o, want %d:%d mode %o", uid, gid, mode, tt.uid, tt.gid, tt.mode)
			}
		})
	}
	if capsOK {
		buf := make([]byte, 64)
		n, err := unix.Getxattr(capFile, capXattr, buf)
		if err != nil {
			t.Fatalf("capabilities lost: %v", err)
		}
		if n != 24 || binary.LittleEndian.Uint32(buf[0:]) != 0x03000001 || binary.LittleEndian.Uint32(buf[4:]) != 1<<13 || binary.LittleEndian.Uint32(buf[20:]) != base {
			t.Errorf("capabilities after shift: % x, want version 3, cap_net_raw+ep, root id %d", buf[:n], base)
		}
	}
	// A second run changes nothing.
	if err := Shift(dir, base, size); err != nil {
		t.Fatal(err)
	}
	if uid, _, _ := owner(t, filepath.Join(dir, "home/u")); uid != base+1000 {
		t.Errorf("second shift moved home/u to %d", uid)
	}
}

func modeBits(m int) os.FileMode {
	var fm os.FileMode
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	return fm
}

func TestShiftRefusesIDsOutsideTheRange(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "big")
	os.WriteFile(p, nil, 0o644)
	if err := os.Lchown(p, 70000, 0); err != nil {
		t.Fatal(err)
	}
	if err := Shift(dir, 1<<30, 65536); err == nil {
		t.Fatal("uid 70000 shifted into a 65536-id range")
	}
}

func TestShifted(t *testing.T) {
	requireRoot(t)
	const base, size = 1 << 30, 65536
	s, snap := newTestStore(t)
	ctx := context.Background()
	if err := s.Import(ctx, "imp", makeTree(t), nil); err != nil {
		t.Fatal(err)
	}
	in, err := s.Shifted(ctx, "imp", base, size)
	if err != nil {
		t.Fatal(err)
	}
	if in.Snapshot != ShiftedName("imp", base) || in.Name != "imp" || in.Shell != "/bin/bash" {
		t.Fatalf("shifted info %+v", in)
	}
	if uid, gid, _ := owner(t, filepath.Join(in.Path, "etc/os-release")); uid != base || gid != base {
		t.Errorf("shifted file owned by %d:%d", uid, gid)
	}
	img, _ := s.Get(ctx, "imp")
	if uid, _, _ := owner(t, filepath.Join(img.Path, "etc/os-release")); uid != 0 {
		t.Errorf("the image itself was shifted (uid %d)", uid)
	}
	assertNoBuildLeftovers(t, snap)
	// Kept: a second call finds the copy (a marker in it survives).
	os.WriteFile(filepath.Join(in.Path, "marker"), nil, 0o644)
	if _, err := s.Shifted(ctx, "imp", base, size); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(in.Path, "marker")); err != nil {
		t.Errorf("second Shifted remade the copy: %v", err)
	}
	if list, _ := s.List(ctx); len(list) != 1 {
		t.Errorf("List shows %d images, want the one (not its shifted copy)", len(list))
	}
	// A replaced image gets a fresh copy.
	if err := s.Remove(ctx, "imp"); err != nil {
		t.Fatal(err)
	}
	if vols, _ := snap.List(ctx, ShiftedPrefix); len(vols) != 0 {
		t.Errorf("Remove left shifted copies: %v", vols)
	}
	if err := s.Import(ctx, "imp", makeTree(t), nil); err != nil {
		t.Fatal(err)
	}
	img, _ = s.Get(ctx, "imp")
	os.WriteFile(filepath.Join(img.Path, MetadataPath), []byte(`{"name":"imp","source":"new"}`), 0o644)
	in, err = s.Shifted(ctx, "imp", base, size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(in.Path, "marker")); err == nil {
		t.Errorf("replaced image kept its old shifted copy")
	}
}
