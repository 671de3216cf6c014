package inspector

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr/btrfs"
)

// sparseDir returns a directory for sparse test files: a tmpfs mounted for
// the test when it can mount one (root), whose largest file is 8 EiB - 1
// as on btrfs, else the test's temporary directory (ext4 stops at 16 TiB;
// the tests then use the largest size it takes).
func sparseDir(t testing.TB) string {
	dir := t.TempDir()
	mnt := filepath.Join(dir, "tmpfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("arbor-sparse", mnt, "tmpfs", 0, "size=256m"); err != nil {
		t.Logf("no tmpfs (%v): sparse files in %s", err, dir)
		return dir
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// largestSize is the largest file size the file system at dir takes.
func largestSize(t testing.TB, dir string) int64 {
	f, err := os.CreateTemp(dir, "probe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	for size := int64(math.MaxInt64); size > 0; size = size/2 + 1 {
		if err := f.Truncate(size); err == nil {
			return size
		}
	}
	t.Fatalf("%s takes no file size", dir)
	return 0
}

// sparseFile describes /work/f in one tree: its size, the data written at
// some offsets (the rest is holes), and whether its mtime is set to the
// same fixed time as the other tree's (as `touch -r` or a restore would),
// so that only the content can tell the files apart.
type sparseFile struct {
	size      int64
	data      map[int64]string
	sameMtime bool
}

var fixedMtime = []unix.Timespec{{Sec: 1_700_000_000}, {Sec: 1_700_000_000}}

// write makes root/work/name as f describes.
func (f sparseFile) write(t testing.TB, root, name string) {
	t.Helper()
	p := filepath.Join(root, "work", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	file, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if err := file.Truncate(f.size); err != nil {
		t.Fatalf("truncate -s %d %s: %v", f.size, p, err)
	}
	for off, s := range f.data {
		if _, err := file.WriteAt([]byte(s), off); err != nil {
			t.Fatalf("write %d bytes at %d in %s: %v", len(s), off, p, err)
		}
	}
	if f.sameMtime {
		if err := unix.UtimesNano(p, fixedMtime); err != nil {
			t.Fatal(err)
		}
	}
}

// trees makes live and snap roots under dir with /work/f as described.
func trees(t testing.TB, dir string, live, snap sparseFile) (liveRoot, snapRoot string) {
	t.Helper()
	liveRoot, snapRoot = filepath.Join(dir, "live"), filepath.Join(dir, "snap")
	// The snapshot first: a live file written after it has a later mtime.
	snap.write(t, snapRoot, "f")
	live.write(t, liveRoot, "f")
	return liveRoot, snapRoot
}

// TestSparseComparisons compares sparse files whose logical size is far
// beyond what could be read, and checks through the budget's counter that
// only their data is read: a hole never is.
func TestSparseComparisons(t *testing.T) {
	const gib = int64(1) << 30
	dir := sparseDir(t)
	huge := largestSize(t, dir)
	t.Logf("largest file in %s: %d bytes", dir, huge)
	if huge < 30*gib {
		t.Fatalf("%s takes files of at most %d bytes, want at least 30 GiB", dir, huge)
	}
	page := int64(os.Getpagesize())
	mib := int64(1) << 20
	tests := []struct {
		name        string
		live, snap  sparseFile
		cap         int64
		want        bool  // changed
		minRead     int64 // bytes the budget must have counted, at least
		maxRead     int64 // and at most
		wantUnprove int64
	}{
		{
			// The issue's `echo a >> /sparse`: 120 s before, hashing
			// 60 GiB of holes. The sizes differ: nothing is read.
			name: "30 GiB, one line appended",
			snap: sparseFile{size: 30 * gib},
			live: sparseFile{size: 30*gib + 2, data: map[int64]string{30 * gib: "a\n"}},
			want: true,
		},
		{
			name: "30 GiB, last byte written, mtime put back",
			snap: sparseFile{size: 30 * gib, sameMtime: true},
			live: sparseFile{size: 30 * gib, data: map[int64]string{30*gib - 1: "a"}, sameMtime: true},
			want: true,
		},
		{
			name:    "30 GiB, same extents, one byte differs",
			snap:    sparseFile{size: 30 * gib, data: map[int64]string{10 * gib: "hello"}, sameMtime: true},
			live:    sparseFile{size: 30 * gib, data: map[int64]string{10 * gib: "hellO"}, sameMtime: true},
			want:    true,
			minRead: 2 * 5,
			maxRead: 2 * 64 << 10,
		},
		{
			name:    "30 GiB, identical data at the same offsets",
			snap:    sparseFile{size: 30 * gib, data: map[int64]string{0: "head", 10 * gib: "middle", 30*gib - 4: "tail"}, sameMtime: true},
			live:    sparseFile{size: 30 * gib, data: map[int64]string{0: "head", 10 * gib: "middle", 30*gib - 4: "tail"}, sameMtime: true},
			want:    false,
			minRead: 2 * 3 * page,
			maxRead: 2 * 3 * 64 << 10,
		},
		{
			name: "largest size (8 EiB - 1 on tmpfs and btrfs), one byte appended",
			snap: sparseFile{size: huge - 1},
			live: sparseFile{size: huge, data: map[int64]string{huge - 1: "a"}},
			want: true,
		},
		{
			name: "largest size, last byte written, mtime put back",
			snap: sparseFile{size: huge, sameMtime: true},
			live: sparseFile{size: huge, data: map[int64]string{huge - 1: "a"}, sameMtime: true},
			want: true,
		},
		{
			name:    "largest size, identical data at the start and the middle",
			snap:    sparseFile{size: huge, data: map[int64]string{0: "head", huge / 2: "middle"}, sameMtime: true},
			live:    sparseFile{size: huge, data: map[int64]string{0: "head", huge / 2: "middle"}, sameMtime: true},
			want:    false,
			minRead: 2 * 2 * page,
			maxRead: 2 * 2 * 64 << 10,
		},
		{
			// Linux 6.18's tmpfs hides a file's last page from
			// SEEK_DATA at this size: the blocks the files have
			// allocated, which the extents found do not account for,
			// tell that they may differ.
			name:    "largest size, last byte differs, same allocation",
			snap:    sparseFile{size: huge, data: map[int64]string{0: "head", huge - 1: "a"}, sameMtime: true},
			live:    sparseFile{size: huge, data: map[int64]string{0: "head", huge - 1: "b"}, sameMtime: true},
			want:    true,
			minRead: 2 * 4,
			maxRead: 2 * 2 * 64 << 10,
		},
		{
			// Several chunks of data, all read and equal.
			name:    "3 MiB of identical data",
			snap:    sparseFile{size: 3 * mib, data: map[int64]string{0: string(bytes.Repeat([]byte("x"), 3<<20))}, sameMtime: true},
			live:    sparseFile{size: 3 * mib, data: map[int64]string{0: string(bytes.Repeat([]byte("x"), 3<<20))}, sameMtime: true},
			want:    false,
			minRead: 2 * 3 * mib,
			maxRead: 2 * 3 * mib,
		},
		{
			// Past the cap nothing is proven equal: changed, unread.
			name:        "3 MiB of identical data, cap 4 MiB",
			snap:        sparseFile{size: 3 * mib, data: map[int64]string{0: string(bytes.Repeat([]byte("x"), 3<<20))}, sameMtime: true},
			live:        sparseFile{size: 3 * mib, data: map[int64]string{0: string(bytes.Repeat([]byte("x"), 3<<20))}, sameMtime: true},
			cap:         4 * mib,
			want:        true,
			wantUnprove: 1,
		},
		{
			name:        "identical one-byte files, cap 0 (never read)",
			snap:        sparseFile{size: 1, data: map[int64]string{0: "x"}, sameMtime: true},
			live:        sparseFile{size: 1, data: map[int64]string{0: "x"}, sameMtime: true},
			cap:         -1,
			want:        true,
			wantUnprove: 1,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := filepath.Join(dir, "case", string(rune('a'+i)))
			defer os.RemoveAll(d)
			live, snap := trees(t, d, tt.live, tt.snap)
			limit := tt.cap
			if limit == 0 {
				limit = DefaultMaxRead
			}
			bud := NewBudget(limit)
			start := time.Now()
			got, err := PathChangedWithin(context.Background(), bud, live, snap, "/work/f")
			t.Logf("changed %v, %d bytes read, %v", got, bud.Read(), time.Since(start))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("changed %v, want %v", got, tt.want)
			}
			if r := bud.Read(); r < tt.minRead || r > tt.maxRead {
				t.Errorf("read %d bytes, want %d to %d", r, tt.minRead, tt.maxRead)
			}
			if u := bud.Unproven(); u != tt.wantUnprove {
				t.Errorf("%d files unproven, want %d", u, tt.wantUnprove)
			}
		})
	}
}

// TestBudgetSharedByATurn: the cap is for all the comparisons of a turn.
// The first pair fits and is read; the second no longer does and counts
// as changed without a read.
func TestBudgetSharedByATurn(t *testing.T) {
	dir := sparseDir(t)
	data := string(bytes.Repeat([]byte("y"), 3<<20))
	f := sparseFile{size: int64(len(data)), data: map[int64]string{0: data}, sameMtime: true}
	live, snap := filepath.Join(dir, "live"), filepath.Join(dir, "snap")
	for _, name := range []string{"one", "two"} {
		f.write(t, snap, name)
		f.write(t, live, name)
	}
	bud := NewBudget(8 << 20)
	for _, c := range []struct {
		path string
		want bool
		read int64
	}{
		{"/work/one", false, 6 << 20},
		{"/work/two", true, 6 << 20},
	} {
		got, err := PathChangedWithin(context.Background(), bud, live, snap, c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want || bud.Read() != c.read {
			t.Errorf("%s: changed %v after %d bytes read, want %v after %d", c.path, got, bud.Read(), c.want, c.read)
		}
	}
	if bud.Unproven() != 1 {
		t.Errorf("%d files unproven, want 1", bud.Unproven())
	}
}

// TestBudgetRunsOutMidFile: when the allocated blocks understate the data
// (compression, or a file that grew), the budget still stops the reading
// at the chunk that would pass it, and the file counts as changed.
func TestBudgetRunsOutMidFile(t *testing.T) {
	dir := sparseDir(t)
	data := string(bytes.Repeat([]byte("z"), 4<<20))
	f := sparseFile{size: int64(len(data)), data: map[int64]string{0: data}, sameMtime: true}
	live, snap := trees(t, dir, f, f)
	_, ra, err := stateOf(live, "/work/f")
	if err != nil {
		t.Fatal(err)
	}
	_, rb, err := stateOf(snap, "/work/f")
	if err != nil {
		t.Fatal(err)
	}
	ra.blocks, rb.blocks = 0, 0 // as a compressing file system might show
	bud := NewBudget(5 << 20)
	same, err := sameContent(context.Background(), bud, ra, rb, f.size)
	if err != nil {
		t.Fatal(err)
	}
	if same {
		t.Error("proven equal past the cap")
	}
	if bud.Read() != 4<<20 || bud.Unproven() != 1 {
		t.Errorf("read %d bytes, %d unproven; want 2 chunks of each file (%d) and 1", bud.Read(), bud.Unproven(), 4<<20)
	}
}

// TestComparisonStopsWithItsContext: a comparison whose context ends
// between two chunks returns the context's error, reads no further chunk
// and leaves no goroutine behind.
func TestComparisonStopsWithItsContext(t *testing.T) {
	dir := sparseDir(t)
	data := string(bytes.Repeat([]byte("w"), 8<<20))
	f := sparseFile{size: int64(len(data)), data: map[int64]string{0: data}, sameMtime: true}
	live, snap := trees(t, dir, f, f)
	tests := []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		end     func(ctx context.Context, cancel context.CancelFunc) // in the first chunk
		wantErr []error
		notErr  error
	}{
		{
			name: "cancelled",
			ctx:  func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			end: func(ctx context.Context, cancel context.CancelFunc) {
				cancel()
			},
			wantErr: []error{context.Canceled},
			notErr:  ErrStalled,
		},
		{
			name: "deadline passed",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 50*time.Millisecond)
			},
			end: func(ctx context.Context, cancel context.CancelFunc) {
				<-ctx.Done()
			},
			wantErr: []error{ErrStalled, context.DeadlineExceeded},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			ctx, cancel := tt.ctx()
			defer cancel()
			bud := NewBudget(DefaultMaxRead)
			var chunks atomic.Int32
			bud.afterChunk = func() {
				if chunks.Add(1) == 1 {
					tt.end(ctx, cancel)
				}
			}
			got, err := PathChangedWithin(ctx, bud, live, snap, "/work/f")
			for _, w := range tt.wantErr {
				if !errors.Is(err, w) {
					t.Errorf("err %v, want %v", err, w)
				}
			}
			if tt.notErr != nil && errors.Is(err, tt.notErr) {
				t.Errorf("err %v is %v", err, tt.notErr)
			}
			if got {
				t.Error("changed true with an error: want the zero answer")
			}
			// The comparison's goroutine must end, not run on.
			for wait := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > before; {
				if time.Now().After(wait) {
					buf := make([]byte, 1<<16)
					t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
				}
				time.Sleep(time.Millisecond)
			}
			if n := chunks.Load(); n != 1 || bud.Read() != 2*chunk {
				t.Errorf("%d chunks, %d bytes read after the context ended in the first; want 1, %d", n, bud.Read(), 2*chunk)
			}
		})
	}
}

// BenchmarkSparse30GiB compares two 30 GiB files with 4 KiB of data at
// three offsets, equal in all but the last byte, with the same mtime: the
// case that read 60 GiB before comparisons skipped holes.
func BenchmarkSparse30GiB(b *testing.B) {
	dir := sparseDir(b)
	const size = int64(30) << 30
	snap := sparseFile{size: size, data: map[int64]string{0: "a", size / 2: "b", size - 1: "c"}, sameMtime: true}
	live := sparseFile{size: size, data: map[int64]string{0: "a", size / 2: "b", size - 1: "C"}, sameMtime: true}
	liveRoot, snapRoot := trees(b, dir, live, snap)
	var read int64
	for b.Loop() {
		bud := NewBudget(DefaultMaxRead)
		changed, err := PathChangedWithin(context.Background(), bud, liveRoot, snapRoot, "/work/f")
		if err != nil || !changed {
			b.Fatalf("changed %v, err %v", changed, err)
		}
		read = bud.Read()
	}
	b.ReportMetric(float64(read), "bytes-read/op")
}

// TestBtrfsSnapshotComparisons compares files with their snapshot on
// btrfs, as the Inspector does: a file the turn did not change compares
// equal (an inline file, a plain one, sparse ones up to btrfs's largest
// size: their extents account for their blocks), and changes are found
// reading only data.
func TestBtrfsSnapshotComparisons(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a btrfs pool")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("btrfs-progs not installed: run make deps")
	}
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: t.TempDir(), PoolSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := snap.Unmount(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := snap.CreateVolume(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	live := snap.Path("live")
	const gib = int64(1) << 30
	huge := largestSize(t, live)
	t.Logf("largest file on btrfs: %d bytes", huge)
	files := map[string]sparseFile{
		"inline": {size: 100, data: map[int64]string{0: string(bytes.Repeat([]byte("i"), 100))}},
		"plain":  {size: 3 << 20, data: map[int64]string{0: string(bytes.Repeat([]byte("p"), 3<<20))}},
		"sparse": {size: 30 * gib, data: map[int64]string{0: "head", 10 * gib: "middle", 30*gib - 4: "tail"}},
		"huge":   {size: huge, data: map[int64]string{0: "head", huge / 2: "middle", huge - 1: "z"}},
		"append": {size: 30 * gib},
	}
	for name, f := range files {
		f.write(t, live, name)
	}
	if err := snap.Snapshot(ctx, "live", "snap"); err != nil {
		t.Fatal(err)
	}
	root := snap.Path("snap")
	for name := range files {
		bud := NewBudget(DefaultMaxRead)
		changed, err := PathChangedWithin(ctx, bud, live, root, "/work/"+name)
		t.Logf("%s unchanged: changed %v, %d bytes read", name, changed, bud.Read())
		if err != nil || changed {
			t.Errorf("%s, unchanged: changed %v, err %v", name, changed, err)
		}
	}

	// The turn: the last byte of the huge file rewritten, its mtime put
	// back; a line appended to the 30 GiB one (`echo a >> append`).
	p := filepath.Join(live, "work", "huge")
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("Z"), huge-1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "work", "huge"), &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.UtimesNano(p, []unix.Timespec{st.Atim, st.Mtim}); err != nil {
		t.Fatal(err)
	}
	f, err = os.OpenFile(filepath.Join(live, "work", "append"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("a\n")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, c := range []struct {
		name    string
		maxRead int64
	}{
		{"huge", 2 * 3 * 64 << 10},
		{"append", 0},
	} {
		bud := NewBudget(DefaultMaxRead)
		changed, err := PathChangedWithin(ctx, bud, live, root, "/work/"+c.name)
		t.Logf("%s changed: changed %v, %d bytes read", c.name, changed, bud.Read())
		if err != nil || !changed {
			t.Errorf("%s, changed: changed %v, err %v", c.name, changed, err)
		}
		if bud.Read() > c.maxRead {
			t.Errorf("%s: %d bytes read, want at most %d", c.name, bud.Read(), c.maxRead)
		}
	}
}
