package imgcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

type dirs struct{ hot, cold string }

func newDirs(t testing.TB) dirs {
	root := t.TempDir()
	return dirs{hot: filepath.Join(root, "hot"), cold: filepath.Join(root, "cold")}
}

func open(t testing.TB, d dirs, capacity int64, copyOnly bool) *Cache {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, ok := t.(*testing.B); ok {
		log = nil // benchmarks measure the cache, not the logger
	}
	c, err := Open(Options{
		HotDir: d.hot, ColdDir: d.cold, HotBytes: capacity, NoMount: true, copyOnly: copyOnly,
		Logger: log,
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return c
}

// content is the deterministic image body of id.
func content(id string, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(len(id)), uint64(id[0])))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// put dumps a fake image of size bytes (pages file plus a small
// subdirectory, as CRIU leaves) and commits it.
func put(t testing.TB, c *Cache, id string, size int) {
	t.Helper()
	putWith(t, c, id, size, func(dir string) error {
		if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
			return err
		}
		return os.Symlink("../pages-1.img", filepath.Join(dir, "sub", "link"))
	})
}

// putWith dumps a fake image of size bytes of pages, adds what more does,
// and commits it.
func putWith(t testing.TB, c *Cache, id string, size int, more func(dir string) error) {
	t.Helper()
	dir, err := c.NewDir(id)
	if err != nil {
		t.Fatalf("NewDir %s: %v", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), content(id, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := more(dir); err != nil {
		t.Fatal(err)
	}
	n, err := c.Commit(id)
	if err != nil {
		t.Fatalf("Commit %s: %v", id, err)
	}
	if n != int64(size) {
		t.Fatalf("Commit %s = %d bytes, want %d", id, n, size)
	}
}

// checkImage verifies that dir holds id's image intact.
func checkImage(t testing.TB, dir, id string, size int) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(dir, "pages-1.img"))
	if err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	if !bytes.Equal(got, content(id, size)) {
		t.Fatalf("image %s corrupted (%d bytes)", id, len(got))
	}
	if l, err := os.Readlink(filepath.Join(dir, "sub", "link")); err != nil || l != "../pages-1.img" {
		t.Fatalf("image %s: symlink %q, %v", id, l, err)
	}
}

// where lists the ids found on disk in each directory, ignoring leftovers.
func where(t testing.TB, d dirs) (hot, cold []string) {
	t.Helper()
	ls := func(dir string) []string {
		des, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, de := range des {
			ids = append(ids, de.Name())
		}
		return ids
	}
	return ls(d.hot), ls(d.cold)
}

func eq(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func acquire(t testing.TB, c *Cache, id string) (string, func()) {
	t.Helper()
	p, rel, err := c.Acquire(context.Background(), id)
	if err != nil {
		t.Fatalf("Acquire %s: %v", id, err)
	}
	return p, rel
}

func TestEviction(t *testing.T) {
	type op struct {
		put  string // commit an image of size bytes under this id
		size int
		use  string // acquire and release this id
	}
	tests := []struct {
		name     string
		capacity int64
		ops      []op
		hot      []string
		cold     []string
	}{
		{
			name:     "fits",
			capacity: 300,
			ops:      []op{{put: "a", size: 100}, {put: "b", size: 100}, {put: "c", size: 100}},
			hot:      []string{"a", "b", "c"},
		},
		{
			name:     "oldest out first",
			capacity: 250,
			ops:      []op{{put: "a", size: 100}, {put: "b", size: 100}, {put: "c", size: 100}},
			hot:      []string{"b", "c"},
			cold:     []string{"a"},
		},
		{
			name:     "use refreshes",
			capacity: 250,
			ops:      []op{{put: "a", size: 100}, {put: "b", size: 100}, {use: "a"}, {put: "c", size: 100}},
			hot:      []string{"a", "c"},
			cold:     []string{"b"},
		},
		{
			name:     "by bytes, not count",
			capacity: 250,
			ops:      []op{{put: "a", size: 50}, {put: "b", size: 50}, {put: "c", size: 50}, {put: "big", size: 200}},
			hot:      []string{"c", "big"},
			cold:     []string{"a", "b"},
		},
		{
			name:     "image larger than the cache goes cold",
			capacity: 100,
			ops:      []op{{put: "a", size: 50}, {put: "huge", size: 500}},
			cold:     []string{"a", "huge"}, // strict LRU: a is older

		},
		{
			name:     "load back evicts another",
			capacity: 250,
			ops:      []op{{put: "a", size: 100}, {put: "b", size: 100}, {put: "c", size: 100}, {use: "a"}},
			hot:      []string{"c", "a"},
			cold:     []string{"a", "b"}, // a keeps its cold copy
		},
	}
	for _, copyOnly := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/copy=%v", tt.name, copyOnly), func(t *testing.T) {
				d := newDirs(t)
				c := open(t, d, tt.capacity, copyOnly)
				sizes := map[string]int{}
				for _, o := range tt.ops {
					if o.put != "" {
						put(t, c, o.put, o.size)
						sizes[o.put] = o.size
					} else {
						p, rel := acquire(t, c, o.use)
						checkImage(t, p, o.use, sizes[o.use])
						rel()
					}
				}
				hot, cold := where(t, d)
				if !eq(hot, tt.hot) || !eq(cold, tt.cold) {
					t.Errorf("hot %v cold %v, want hot %v cold %v", hot, cold, tt.hot, tt.cold)
				}
				s := c.Stats()
				var hb, cb int64
				for _, id := range tt.hot {
					hb += int64(sizes[id])
				}
				for _, id := range tt.cold {
					cb += int64(sizes[id])
				}
				if s.HotBytes != hb || s.HotCount != len(tt.hot) || s.ColdBytes != cb || s.ColdCount != len(tt.cold) {
					t.Errorf("stats %+v, want hot %d/%d cold %d/%d", s, hb, len(tt.hot), cb, len(tt.cold))
				}
				if s.HotBytes > tt.capacity {
					t.Errorf("hot bytes %d over capacity %d", s.HotBytes, tt.capacity)
				}
				for _, id := range tt.cold {
					checkImage(t, filepath.Join(d.cold, id), id, sizes[id])
				}
			})
		}
	}
}

func TestColdLoadBack(t *testing.T) {
	d := newDirs(t)
	c := open(t, d, 100, true)
	put(t, c, "a", 80)
	put(t, c, "b", 80) // evicts a
	if s := c.Stats(); s.Evictions != 1 {
		t.Fatalf("evictions = %d", s.Evictions)
	}
	p, rel := acquire(t, c, "a") // loads a, evicts b
	if p != filepath.Join(d.hot, "a") {
		t.Errorf("path %s not in HotDir", p)
	}
	checkImage(t, p, "a", 80)
	rel()
	rel() // twice is harmless
	path, err := c.Get(context.Background(), "a")
	if err != nil || path != p {
		t.Fatalf("Get = %s, %v", path, err)
	}
	s := c.Stats()
	if s.Misses != 1 || s.Hits != 1 || s.Evictions != 2 || s.Pinned != 0 {
		t.Errorf("stats %+v", s)
	}
	// a still has its cold copy: evicting it again only drops the hot one.
	put(t, c, "c", 80)
	hot, cold := where(t, d)
	if !eq(hot, []string{"c"}) || !eq(cold, []string{"a", "b"}) {
		t.Errorf("hot %v cold %v", hot, cold)
	}
	for _, id := range []string{"a", "b", "c"} {
		if !c.Has(id) {
			t.Errorf("Has(%s) = false", id)
		}
	}
}

func TestPinning(t *testing.T) {
	d := newDirs(t)
	c := open(t, d, 200, false)
	put(t, c, "a", 100)
	pa, relA := acquire(t, c, "a")
	put(t, c, "b", 100)
	put(t, c, "c", 100) // a is the oldest, but pinned: b goes
	hot, _ := where(t, d)
	if !eq(hot, []string{"a", "c"}) {
		t.Fatalf("hot %v, want a (pinned) and c", hot)
	}
	put(t, c, "d", 100) // c goes; a stays though it is older
	checkImage(t, pa, "a", 100)
	if err := c.Remove(context.Background(), "a"); !errors.Is(err, ErrBusy) {
		t.Errorf("Remove pinned = %v, want ErrBusy", err)
	}
	// A second pin of the same image; releasing one keeps it pinned.
	_, relA2 := acquire(t, c, "a")
	relA()
	put(t, c, "e", 100)
	checkImage(t, pa, "a", 100)
	if s := c.Stats(); s.Pinned != 1 {
		t.Errorf("pinned = %d", s.Pinned)
	}
	// A new image with everything else pinned goes cold at once.
	_, relE := acquire(t, c, "e")
	put(t, c, "f", 100)
	if hot, _ := where(t, d); !eq(hot, []string{"a", "e"}) {
		t.Errorf("hot %v, want a, e (pinned)", hot)
	}
	// Loading one back with everything pinned goes over budget until a
	// release lets the cache shrink.
	pb, relB := acquire(t, c, "b")
	checkImage(t, pb, "b", 100)
	if s := c.Stats(); s.HotBytes != 300 || s.Pinned != 3 {
		t.Errorf("stats %+v, want 300 hot bytes, 3 pinned", s)
	}
	relE() // e is the only idle image: it goes
	relB()
	relA2()
	s := c.Stats()
	if s.HotBytes != 200 || s.Pinned != 0 {
		t.Errorf("after release: %+v", s)
	}
	if hot, _ := where(t, d); !eq(hot, []string{"a", "b"}) {
		t.Errorf("hot %v, want a, b", hot)
	}
}

// TestParallelAcquire is branch(n): n restores acquire one cold image at
// once; one load serves them all and each sees the whole image.
func TestParallelAcquire(t *testing.T) {
	const n = 16
	const size = 1 << 20
	for _, copyOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("copy=", copyOnly), func(t *testing.T) {
			d := newDirs(t)
			c := open(t, d, size+1, copyOnly)
			put(t, c, "src", size)
			put(t, c, "other", size) // evicts src
			var wg, held sync.WaitGroup
			var mu sync.Mutex
			paths := map[string]int{}
			start, done := make(chan struct{}), make(chan struct{})
			for range n {
				wg.Add(1)
				held.Add(1)
				go func() {
					defer wg.Done()
					<-start
					p, rel, err := c.Acquire(context.Background(), "src")
					held.Done()
					if err != nil {
						t.Error(err)
						return
					}
					defer rel()
					<-done
					checkImage(t, p, "src", size)
					mu.Lock()
					paths[p]++
					mu.Unlock()
				}()
			}
			close(start)
			held.Wait()
			put(t, c, "third", size) // pushes for eviction while src is held
			close(done)
			wg.Wait()
			if len(paths) != 1 {
				t.Errorf("paths %v, want one", paths)
			}
			if s := c.Stats(); s.Misses != 1 || s.Hits != n-1 || s.Pinned != 0 || s.HotBytes > size+1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func TestReopen(t *testing.T) {
	d := newDirs(t)
	c := open(t, d, 1000, false)
	for _, id := range []string{"a", "b", "c", "d"} {
		put(t, c, id, 100)
	}
	put(t, c, "e", 500)
	put(t, c, "f", 200) // evicts a
	before := c.Stats()
	hot0, cold0 := where(t, d)

	// Age the hot images into an order unlike their names: d oldest.
	base := time.Now().Add(-time.Hour)
	for i, id := range []string{"d", "c", "e", "f", "b"} {
		if err := os.Chtimes(filepath.Join(d.hot, id), time.Time{}, base.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}

	c2 := open(t, d, 1000, false)
	after := c2.Stats()
	if after.HotBytes != before.HotBytes || after.HotCount != before.HotCount ||
		after.ColdBytes != before.ColdBytes || after.ColdCount != before.ColdCount {
		t.Errorf("reopened stats %+v, before %+v", after, before)
	}
	hot1, cold1 := where(t, d)
	if !eq(hot0, hot1) || !eq(cold0, cold1) {
		t.Errorf("reopen moved images: %v/%v -> %v/%v", hot0, cold0, hot1, cold1)
	}
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		if !c2.Has(id) {
			t.Errorf("reopened cache lost %s", id)
		}
	}

	// Reopen smaller: the oldest by mtime go first (d, c, e).
	c3 := open(t, d, 650, false)
	hot2, cold2 := where(t, d)
	if s := c3.Stats(); s.HotBytes != 300 {
		t.Errorf("hot bytes %d, want 300", s.HotBytes)
	}
	if !eq(hot2, []string{"b", "f"}) || !eq(cold2, []string{"a", "c", "d", "e"}) {
		t.Errorf("after shrinking reopen hot %v cold %v", hot2, cold2)
	}
}

func TestCrashLeftovers(t *testing.T) {
	d := newDirs(t)
	c := open(t, d, 1000, false)
	put(t, c, "good", 10)
	half, err := c.NewDir("half") // a dump that never committed
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(half, "pages-1.img"), []byte("partial"), 0o600)
	// Copies interrupted mid-way, in both directories.
	for _, p := range []string{
		filepath.Join(d.hot, tmpPrefix+"good-123"),
		filepath.Join(d.cold, tmpPrefix+"x-456"),
	} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p, "pages-1.img"), []byte("torn"), 0o600)
	}
	// Things that are not ours stay.
	os.WriteFile(filepath.Join(d.cold, "README"), []byte("hi"), 0o600)

	c2 := open(t, d, 1000, false)
	hot, cold := where(t, d)
	if !eq(hot, []string{"good"}) || !eq(cold, []string{"README"}) {
		t.Errorf("after reopen hot %v cold %v", hot, cold)
	}
	if c2.Has("half") {
		t.Error("uncommitted image survived a reopen")
	}
	if s := c2.Stats(); s.HotCount != 1 || s.HotBytes != 10 || s.ColdCount != 0 {
		t.Errorf("stats %+v", s)
	}
	// The id of the lost dump can be used again.
	put(t, c2, "half", 20)
}

func TestRemove(t *testing.T) {
	ctx := context.Background()
	d := newDirs(t)
	c := open(t, d, 150, false)
	put(t, c, "cold", 100)
	put(t, c, "hot", 100)
	_, rel := acquire(t, c, "cold") // now both hot and cold; evicts "hot"
	rel()
	put(t, c, "new", 10)
	if _, err := c.NewDir("pending"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		id   string
		want error
	}{
		{name: "hot and cold copies", id: "cold"},
		{name: "cold only", id: "hot"},
		{name: "hot only", id: "new"},
		{name: "uncommitted", id: "pending"},
		{name: "again", id: "cold", want: ErrNotFound},
		{name: "unknown", id: "nope", want: ErrNotFound},
		{name: "invalid", id: "../x", want: ErrInvalidID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.Remove(ctx, tt.id); !errors.Is(err, tt.want) {
				t.Fatalf("Remove = %v, want %v", err, tt.want)
			}
			if c.Has(tt.id) {
				t.Error("still there")
			}
		})
	}
	hot, cold := where(t, d)
	if len(hot)+len(cold) != 0 {
		t.Errorf("left hot %v cold %v", hot, cold)
	}
	if s := c.Stats(); s != (Stats{Capacity: 150, Hits: s.Hits, Misses: s.Misses, Evictions: s.Evictions}) {
		t.Errorf("stats after removing all: %+v", s)
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	d := newDirs(t)
	c := open(t, d, 100, false)
	put(t, c, "a", 10)
	if _, err := c.NewDir("p"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"empty id", func() error { _, err := c.NewDir(""); return err }, ErrInvalidID},
		{"dot id", func() error { _, err := c.NewDir(".new-a"); return err }, ErrInvalidID},
		{"slash id", func() error { _, err := c.NewDir("a/b"); return err }, ErrInvalidID},
		{"long id", func() error { _, err := c.NewDir(string(make([]byte, 300))); return err }, ErrInvalidID},
		{"NewDir committed", func() error { _, err := c.NewDir("a"); return err }, ErrExists},
		{"NewDir pending", func() error { _, err := c.NewDir("p"); return err }, ErrExists},
		{"Commit without NewDir", func() error { _, err := c.Commit("zz"); return err }, ErrNotFound},
		{"Commit twice", func() error { _, err := c.Commit("a"); return err }, ErrExists},
		{"Acquire unknown", func() error { _, _, err := c.Acquire(ctx, "zz"); return err }, ErrNotFound},
		{"Acquire uncommitted", func() error { _, _, err := c.Acquire(ctx, "p"); return err }, ErrNotFound},
		{"Get unknown", func() error { _, err := c.Get(ctx, "zz"); return err }, ErrNotFound},
		{"Open without dirs", func() error { _, err := Open(Options{HotBytes: 1, NoMount: true}); return err }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if c.Has("p") {
		t.Error("Has reports an uncommitted image")
	}
}

// TestAcquireWaitsForLoad: a caller whose ctx ends while another loads the
// image gets ctx's error; the load itself completes.
func TestAcquireWaitsForLoad(t *testing.T) {
	d := newDirs(t)
	c := open(t, d, 10, false)
	put(t, c, "a", 8)
	put(t, c, "b", 8) // a cold
	c.mu.Lock()
	e := c.entries["a"]
	e.busy = make(chan struct{}) // as if a load were in flight
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := c.Acquire(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want deadline exceeded", err)
	}
	if err := c.Remove(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Remove = %v, want deadline exceeded", err)
	}
	c.mu.Lock()
	close(e.busy)
	e.busy = nil
	c.mu.Unlock()
	p, rel := acquire(t, c, "a")
	checkImage(t, p, "a", 8)
	rel()
}

// TestRace runs commits, acquisitions, removals and stats from many
// goroutines over a cache far too small for them, then checks that the
// index matches the directories. Run it with -race.
func TestRace(t *testing.T) {
	d := newDirs(t)
	c := open(t, d, 4096, true)
	const size = 1024
	// Each goroutine creates and removes its own ids (as each checkpoint
	// owns its id) and acquires anybody's.
	pick := func(r *rand.Rand, g int) string { return fmt.Sprintf("g%d-%d", g, r.IntN(3)) }
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			ctx := context.Background()
			for range 150 {
				id := pick(r, r.IntN(8))
				switch r.IntN(5) {
				case 0:
					id := fmt.Sprintf("g%d-%d", g, r.IntN(3))
					dir, err := c.NewDir(id)
					if err != nil {
						continue // exists
					}
					// Another goroutine may Remove the dir meanwhile.
					_ = os.WriteFile(filepath.Join(dir, "pages-1.img"), content(id, size), 0o600)
					_ = os.Mkdir(filepath.Join(dir, "sub"), 0o700)
					_ = os.Symlink("../pages-1.img", filepath.Join(dir, "sub", "link"))
					if _, err := c.Commit(id); err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBusy) {
						t.Errorf("Commit %s: %v", id, err)
					}
				case 1, 2:
					p, rel, err := c.Acquire(ctx, id)
					if errors.Is(err, ErrNotFound) {
						continue
					}
					if err != nil {
						t.Errorf("Acquire %s: %v", id, err)
						continue
					}
					checkImage(t, p, id, size)
					rel()
				case 3:
					// Removes its own ids only: a dir still being written
					// is removed only by its owner (a failed dump).
					id := pick(r, g)
					if err := c.Remove(ctx, id); err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBusy) {
						t.Errorf("Remove %s: %v", id, err)
					}
				case 4:
					_ = c.Stats()
					_ = c.Has(id)
				}
			}
		}()
	}
	wg.Wait()
	s := c.Stats()
	hot, cold := where(t, d)
	if s.HotCount != len(hot) || s.ColdCount != len(cold) || s.HotBytes != int64(len(hot)*size) || s.ColdBytes != int64(len(cold)*size) {
		t.Errorf("stats %+v, dirs hot %v cold %v", s, hot, cold)
	}
	if s.HotBytes > 4096 || s.Pinned != 0 || s.Pending != 0 || s.EvictFailures != 0 {
		t.Errorf("stats %+v", s)
	}
	// And a reopen agrees.
	c2 := open(t, d, 4096, true)
	if s2 := c2.Stats(); s2.HotBytes != s.HotBytes || s2.ColdBytes != s.ColdBytes {
		t.Errorf("reopen stats %+v, was %+v", s2, s)
	}
}

func BenchmarkAcquireHot(b *testing.B) {
	d := newDirs(b)
	c := open(b, d, 1<<20, false)
	put(b, c, "a", 4096)
	ctx := context.Background()
	for b.Loop() {
		_, rel, err := c.Acquire(ctx, "a")
		if err != nil {
			b.Fatal(err)
		}
		rel()
	}
}

// BenchmarkColdLoad measures a miss: the image is evicted (it keeps its
// cold copy, so that is a delete) and loaded back, per op.
func BenchmarkColdLoad(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			d := newDirs(b)
			if shm, err := os.MkdirTemp("/dev/shm", "imgcache-bench-"); err == nil {
				b.Cleanup(func() { os.RemoveAll(shm) })
				d.hot = shm // a real tmpfs for the hot side where there is one
			}
			c := open(b, d, int64(size)+1, false)
			put(b, c, "a", size)
			put(b, c, "b", size)
			ctx := context.Background()
			b.SetBytes(int64(size))
			ids := []string{"a", "b"}
			i := 0
			for b.Loop() {
				_, rel, err := c.Acquire(ctx, ids[i%2])
				if err != nil {
					b.Fatal(err)
				}
				rel()
				i++
			}
		})
	}
}

// TestShrink: Shrink moves idle hot images to disk, oldest first, down to
// its target, leaving a pinned one hot; the moved ones load back intact.
func TestShrink(t *testing.T) {
	c := open(t, newDirs(t), 1<<20, false)
	for _, id := range []string{"a1", "b2", "c3"} {
		put(t, c, id, 1000)
	}
	_, release, err := c.Acquire(context.Background(), "a1") // pinned, and now the newest
	if err != nil {
		t.Fatal(err)
	}
	if left := c.Shrink(1500); left != 1000 {
		t.Errorf("Shrink(1500) left %d hot bytes, want 1000 (a1, pinned)", left)
	}
	if left := c.Shrink(0); left != 1000 {
		t.Errorf("Shrink(0) left %d hot bytes, want 1000 (a1, pinned)", left)
	}
	s := c.Stats()
	if s.HotCount != 1 || s.ColdCount != 2 {
		t.Errorf("after Shrink: %+v, want a1 hot and b2, c3 on disk", s)
	}
	release()
	for _, id := range []string{"b2", "c3"} {
		p, err := c.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, p, id, 1000)
	}
}

// putDelta is put with a parent link to ../base, as cr/imgdelta leaves a
// delta image.
func putDelta(t testing.TB, c *Cache, id, base string, size int) {
	t.Helper()
	putWith(t, c, id, size, func(dir string) error { return os.Symlink("../"+base, filepath.Join(dir, "parent")) })
}

// TestDeltaChain: acquiring a delta image brings its whole chain of bases
// into HotDir beside it and pins them all, so CRIU can follow the parent
// links; the release lets go of every one. A base that is gone fails the
// acquire, which pins nothing.
func TestDeltaChain(t *testing.T) {
	ctx := context.Background()
	d := newDirs(t)
	c := open(t, d, 1000, false)
	put(t, c, "a", 100)
	putDelta(t, c, "b", "a", 50)
	putDelta(t, c, "c", "b", 50)
	if got := c.Shrink(0); got != 0 {
		t.Fatalf("Shrink(0) left %d hot bytes", got)
	}
	p, rel := acquire(t, c, "c")
	if p != filepath.Join(d.hot, "c") {
		t.Fatalf("Acquire(c) = %s", p)
	}
	hot, _ := where(t, d)
	if !eq(hot, []string{"a", "b", "c"}) {
		t.Fatalf("hot after Acquire(c): %v, want the chain a, b, c", hot)
	}
	checkImage(t, filepath.Join(p, "parent", "parent"), "a", 100)
	for _, id := range []string{"a", "b", "c"} {
		if err := c.Remove(ctx, id); !errors.Is(err, ErrBusy) {
			t.Fatalf("Remove(%s) while c is acquired: %v, want ErrBusy", id, err)
		}
	}
	if got := c.Shrink(0); got != 200 {
		t.Fatalf("Shrink(0) with c acquired left %d hot bytes, want the chain's 200", got)
	}
	rel()
	rel()
	if got := c.Shrink(0); got != 0 {
		t.Fatalf("Shrink(0) after the release left %d hot bytes", got)
	}
	if err := c.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Acquire(ctx, "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Acquire(c) without a: %v, want ErrNotFound", err)
	}
	if got := c.Shrink(0); got != 0 {
		t.Fatalf("a failed Acquire left %d hot bytes pinned", got)
	}
	for _, id := range []string{"b", "c"} {
		if err := c.Remove(ctx, id); err != nil {
			t.Fatalf("Remove(%s) after the failed acquire: %v", id, err)
		}
	}
}
