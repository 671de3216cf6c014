package imgcache

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountTmpfs opens a cache without NoMount over a plain HotDir that
// already holds an image: the image moves to ColdDir, a tmpfs appears, and
// reopening finds the tmpfs and leaves it be.
func TestMountTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	d := newDirs(t)
	c := open(t, d, 1<<20, false) // NoMount: a plain dir
	put(t, c, "old", 100)
	if ok, err := isTmpfs(d.hot); err != nil || ok {
		t.Fatalf("isTmpfs(plain) = %v, %v", ok, err)
	}

	c, err := Open(Options{HotDir: d.hot, ColdDir: d.cold, HotBytes: 1 << 20})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(d.hot, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", d.hot, err)
		}
	})
	if ok, err := isTmpfs(d.hot); err != nil || !ok {
		t.Fatalf("isTmpfs(after Open) = %v, %v", ok, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.hot, &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size != 2<<20 {
		t.Errorf("tmpfs size %d, want %d", size, 2<<20)
	}
	hot, cold := where(t, d)
	if len(hot) != 0 || !eq(cold, []string{"old"}) {
		t.Errorf("hot %v cold %v, want old moved to cold", hot, cold)
	}
	p, rel := acquire(t, c, "old")
	checkImage(t, p, "old", 100)
	rel()
	if filepath.Dir(p) != d.hot {
		t.Errorf("path %s", p)
	}

	// Reopening sees the tmpfs and does not stack another mount.
	if _, err := Open(Options{HotDir: d.hot, ColdDir: d.cold, HotBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if hot, _ := where(t, d); !eq(hot, []string{"old"}) {
		t.Errorf("after reopen hot %v", hot)
	}
}

// TestCloseUnmounts: Close moves the hot images of a cache that mounted
// its tmpfs to ColdDir and unmounts it; a reopened cache (which found the
// tmpfs left by the first, not closed) does the same; a NoMount cache
// leaves HotDir as it is.
func TestCloseUnmounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	d := newDirs(t)
	t.Cleanup(func() { unix.Unmount(d.hot, unix.MNT_DETACH) })
	c, err := Open(Options{HotDir: d.hot, ColdDir: d.cold, HotBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	put(t, c, "a", 100)
	if _, err := Open(Options{HotDir: d.hot, ColdDir: d.cold, HotBytes: 1 << 20}); err != nil {
		t.Fatal(err) // the first is not closed: its tmpfs is still there
	}
	c, err = Open(Options{HotDir: d.hot, ColdDir: d.cold, HotBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	put(t, c, "b", 200)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if ok, err := isTmpfs(d.hot); err != nil || ok {
		t.Fatalf("after Close, HotDir on a tmpfs: %v, %v", ok, err)
	}
	if hot, cold := where(t, d); len(hot) != 0 || !eq(cold, []string{"a", "b"}) {
		t.Errorf("after Close hot %v cold %v, want both images cold", hot, cold)
	}

	p := open(t, d, 1<<20, false) // NoMount
	put(t, p, "c", 100)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if hot, _ := where(t, d); !eq(hot, []string{"c"}) {
		t.Errorf("a NoMount cache's Close moved its images: hot %v", hot)
	}
}
