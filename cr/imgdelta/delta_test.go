package imgdelta_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

type rig struct {
	c    *criu.Checkpointer
	snap *btrfs.Snapshotter
	sb   *sandbox.Sandbox
	dir  string // the image store: one directory per image
}

func newRig(t testing.TB) *rig {
	t.Helper()
	c := sandboxtest.CRIU(t, slog.Default())
	snap := sandboxtest.Btrfs(t, t.TempDir(), 2<<30, nil)
	ctx := context.Background()
	if err := snap.CreateVolume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", sandboxtest.BusyboxRoot(t, "")+"/.", snap.Path("src")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "deltasrc", Root: snap.Path("src"), InitBinary: sandboxtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	return &rig{c: c, snap: snap, sb: sb, dir: t.TempDir()}
}

func (r *rig) exec(t testing.TB, cmd string) string {
	t.Helper()
	res, err := r.sb.Exec(context.Background(), cmd, sandbox.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%q: %v %+v", cmd, err, res)
	}
	return string(res.Stdout)
}

// dump snapshots the root as snapshot id and dumps the tree into image id.
func (r *rig) dump(t testing.TB, id string) sandbox.IsolationRecord {
	t.Helper()
	ctx := context.Background()
	var rec sandbox.IsolationRecord
	imgs := filepath.Join(r.dir, id)
	if err := os.Mkdir(imgs, 0o700); err != nil {
		t.Fatal(err)
	}
	err := r.sb.Exclusive(func() error {
		if err := r.sb.Freeze(); err != nil {
			return err
		}
		defer r.sb.Thaw()
		if err := r.snap.Snapshot(ctx, "src", id); err != nil {
			return err
		}
		var err error
		if rec, err = r.sb.Isolation(); err != nil {
			return err
		}
		_, err = r.c.Dump(ctx, criu.DumpRequest{PID: r.sb.InitPID(), Dir: imgs, FreezeCgroup: r.sb.FreezerCgroup()})
		return err
	})
	if err != nil {
		t.Fatalf("dump %s: %v", id, err)
	}
	return rec
}

// restore restores image img on a clone of snapshot snapID, lazily or not,
// and runs cmd in the restored shell.
func (r *rig) restore(t *testing.T, snapID, img string, rec sandbox.IsolationRecord, lazy bool, cmd string) string {
	t.Helper()
	ctx := context.Background()
	vol := fmt.Sprintf("child-%s-%v", img, lazy)
	if err := r.snap.Clone(ctx, snapID, vol); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(r.dir, img)
	var lp *criu.LazyPages
	if lazy {
		var err error
		if lp, err = r.c.StartLazyPages(ctx, dir); err != nil {
			t.Fatal(err)
		}
		defer lp.Close()
	}
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: fmt.Sprintf("delta%s%v", img, lazy), Root: r.snap.Path(vol)}, rec, func(join func(int) error) (int, error) {
		req := criu.RestoreRequest{Dir: dir, Root: r.snap.Path(vol), Join: join}
		if lazy {
			return r.c.RestoreLazily(ctx, req, lp)
		}
		return r.c.Restore(ctx, req)
	})
	if err != nil {
		t.Fatalf("restore %s (lazy %v): %v", img, lazy, err)
	}
	defer child.Destroy(ctx)
	res, err := child.Exec(ctx, cmd, sandbox.ExecOptions{})
	if err != nil {
		t.Fatalf("restored %s: %v", img, err)
	}
	return string(res.Stdout)
}

// pages reads every dumped page of every process of the image in dir
// (through its chain) by pid and address, from a flattened copy.
func pages(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	flat := dir + ".flat"
	if err := imgdelta.Flatten(dir, flat); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(flat)
	m, err := imgdelta.Pages(flat)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDeltaRestore: a whole dump made a delta of the one before keeps only
// the pages that changed, restores through CRIU's parent link to the exact
// state (shell variables, a background process's memory), and flattens
// back to the same pages as the whole dump; a delta of a delta restores
// too, through two links.
func TestDeltaRestore(t *testing.T) {
	r := newRig(t)
	// A background shell holding a counter in memory only.
	r.exec(t, "export A=1; (i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done) >/dev/null 2>&1 &")
	time.Sleep(200 * time.Millisecond)
	r.dump(t, "a")
	r.exec(t, "export B=$(seq 1 2000 | tr '\\n' ,)")
	recB := r.dump(t, "b")
	whole := pages(t, filepath.Join(r.dir, "b"))
	st, err := imgdelta.Make(filepath.Join(r.dir, "b"), filepath.Join(r.dir, "a"), "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delta b of a: %+v", st)
	if st.Pages == 0 || st.Kept >= st.Pages || st.Kept == 0 || st.After >= st.Before {
		t.Fatalf("delta b of a: %+v: want some pages kept, fewer than dumped", st)
	}
	if base, err := imgdelta.Base(filepath.Join(r.dir, "b")); err != nil || base != "a" {
		t.Fatalf("Base(b) = %q, %v; want a", base, err)
	}
	if got := pages(t, filepath.Join(r.dir, "b")); !samePages(t, got, whole) {
		t.Fatal("delta b, flattened, differs from the whole dump of b")
	}
	for _, lazy := range []bool{false, true} {
		out := r.restore(t, "b", "b", recB, lazy, "echo $A ${#B}; a=$(cat /tmp/c); sleep 0.3; b=$(cat /tmp/c); [ $b -gt $a ] && echo counting")
		if want := fmt.Sprintf("1 %d\ncounting\n", len(seqCSV(2000))); out != want {
			t.Fatalf("restored delta b (lazy %v): %q, want %q", lazy, out, want)
		}
	}
	// A delta of the delta: pages still unchanged since a are read two
	// links down.
	r.exec(t, "export C=3")
	recC := r.dump(t, "c")
	wholeC := pages(t, filepath.Join(r.dir, "c"))
	if _, err := imgdelta.Make(filepath.Join(r.dir, "c"), filepath.Join(r.dir, "b"), "b"); err != nil {
		t.Fatal(err)
	}
	if got := pages(t, filepath.Join(r.dir, "c")); !samePages(t, got, wholeC) {
		t.Fatal("delta c, flattened, differs from the whole dump of c")
	}
	out := r.restore(t, "c", "c", recC, false, "echo $A ${#B} $C")
	if want := fmt.Sprintf("1 %d 3\n", len(seqCSV(2000))); out != want {
		t.Fatalf("restored delta c: %q, want %q", out, want)
	}
	// Flattened, c restores without a or b.
	flat := filepath.Join(r.dir, "cflat")
	if err := imgdelta.Flatten(filepath.Join(r.dir, "c"), flat); err != nil {
		t.Fatal(err)
	}
	if base, _ := imgdelta.Base(flat); base != "" {
		t.Fatalf("flattened image has base %q", base)
	}
	for _, id := range []string{"a", "b"} {
		if err := os.Rename(filepath.Join(r.dir, id), filepath.Join(r.dir, id+".gone")); err != nil {
			t.Fatal(err)
		}
	}
	out = r.restore(t, "c", "cflat", recC, false, "echo $A ${#B} $C")
	if want := fmt.Sprintf("1 %d 3\n", len(seqCSV(2000))); out != want {
		t.Fatalf("restored flattened c: %q, want %q", out, want)
	}
}

func seqCSV(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d,", i)
	}
	return b.String()
}

func samePages(t *testing.T, got, want map[string][]byte) bool {
	t.Helper()
	ok := len(got) == len(want)
	for k, w := range want {
		if g, found := got[k]; !found || !bytes.Equal(g, w) {
			t.Errorf("page %s: got %d bytes (present %v), want %d", k, len(g), found, len(w))
			ok = false
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d pages, want %d", len(got), len(want))
	}
	return ok
}

// TestMakeRefusesDelta: an image that is already a delta is not made one
// again, and a bad base id is refused; the image is left as it was.
func TestMakeRefusesDelta(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "x")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../y", filepath.Join(img, imgdelta.ParentLink)); err != nil {
		t.Fatal(err)
	}
	if _, err := imgdelta.Make(img, filepath.Join(dir, "z"), "z"); err == nil || !strings.Contains(err.Error(), "already a delta of y") {
		t.Fatalf("Make of a delta: %v", err)
	}
	if _, err := imgdelta.Make(img, filepath.Join(dir, "z"), "../z"); err == nil {
		t.Fatal("Make with base id ../z: no error")
	}
}

// BenchmarkMake times Make on a busybox tree whose shell holds about 7 MB
// in a variable, against the dump before it, one variable apart; each
// iteration copies the whole dump back first (untimed).
func BenchmarkMake(b *testing.B) {
	r := newRig(b)
	r.exec(b, "X=$(seq 1 1000000 | tr '\\n' ,)")
	r.dump(b, "a")
	r.exec(b, "export Y=1")
	r.dump(b, "b")
	whole := filepath.Join(r.dir, "b")
	var st imgdelta.Stats
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := filepath.Join(r.dir, fmt.Sprintf("b%d", i))
		if out, err := exec.Command("cp", "-a", whole, dir).CombinedOutput(); err != nil {
			b.Fatalf("%v %s", err, out)
		}
		b.StartTimer()
		var err error
		if st, err = imgdelta.Make(dir, filepath.Join(r.dir, "a"), "a"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Pages), "pages")
	b.ReportMetric(float64(st.Kept), "kept")
}
