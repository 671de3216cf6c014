package procfs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/internal/procfs"
)

// TestReadFile reads what os.ReadFile reads: /proc files (sized 0 by
// stat, past one read), a regular file larger than the first
// buffer, an empty file, and fails the same way on a missing one.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("0123456789"), 10000), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, path string }{
		{"status", "/proc/self/status"},
		{"limits", "/proc/self/limits"},
		{"mountinfo", "/proc/mounts"},
		{"big", big},
		{"empty", empty},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := os.ReadFile(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := procfs.ReadFile(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			// Files of /proc/self describe the reader: compare their keys.
			if strings.HasPrefix(tt.path, "/proc/self/") {
				if key(got) != key(want) {
					t.Errorf("read %s: keys %q, want %q", tt.path, key(got), key(want))
				}
				return
			}
			if !bytes.Equal(got, want) {
				t.Errorf("read %s: %d bytes, os.ReadFile %d", tt.path, len(got), len(want))
			}
		})
	}
	_, err := procfs.ReadFile(filepath.Join(dir, "missing"))
	var pe *os.PathError
	if !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) || pe.Op != "open" {
		t.Errorf("a missing file: %v, want an open *os.PathError of fs.ErrNotExist", err)
	}
}

// key is the first word of every line.
func key(b []byte) string {
	var ks []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			ks = append(ks, f[0])
		}
	}
	return strings.Join(ks, ",")
}

// TestReadDirNames lists what os.ReadDir lists, in its order, in a folder of
// more entries than one getdents call returns.
func TestReadDirNames(t *testing.T) {
	dir := t.TempDir()
	for i := range 500 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file-with-a-long-name-%04d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{dir, "/proc/self/fd", "/proc/self"} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, e := range ents {
			want = append(want, e.Name())
		}
		got, err := procfs.ReadDirNames(d)
		if err != nil {
			t.Fatal(err)
		}
		// /proc/self/fd holds the descriptor each listing opened.
		if d == "/proc/self/fd" {
			if len(got) < len(want)-1 || len(got) > len(want)+1 {
				t.Errorf("%s: %d names, os.ReadDir %d", d, len(got), len(want))
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %d names, os.ReadDir %d", d, len(got), len(want))
		}
	}
	if _, err := procfs.ReadDirNames(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing folder: %v, want fs.ErrNotExist", err)
	}
}

// TestBounds: a file or folder up to the bound reads whole; one past it
// fails with ErrTooLarge, and a negative bound reads anything.
func TestBounds(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, bytes.Repeat([]byte("x"), 20000), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("n%03d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := procfs.ReadFileMax(f, 20000); err != nil || len(b) != 20000 {
		t.Errorf("ReadFileMax(20000 bytes, 20000) = %d bytes, %v", len(b), err)
	}
	if _, err := procfs.ReadFileMax(f, 19999); !errors.Is(err, procfs.ErrTooLarge) {
		t.Errorf("ReadFileMax(20000 bytes, 19999): %v, want ErrTooLarge", err)
	}
	if b, err := procfs.ReadFileMax(f, -1); err != nil || len(b) != 20000 {
		t.Errorf("ReadFileMax(20000 bytes, -1) = %d bytes, %v", len(b), err)
	}
	if n, err := procfs.ReadDirNamesMax(dir, 301); err != nil || len(n) != 301 {
		t.Errorf("ReadDirNamesMax(301 names, 301) = %d names, %v", len(n), err)
	}
	if _, err := procfs.ReadDirNamesMax(dir, 300); !errors.Is(err, procfs.ErrTooLarge) {
		t.Errorf("ReadDirNamesMax(301 names, 300): %v, want ErrTooLarge", err)
	}
}
