package crtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
)

var time0 = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// smallVolume returns a fresh snapshotter holding volume "vol" with 10
// directories of 10 small files each, and its snapshot snap when snap is
// not empty.
func smallVolume(b *testing.B, newSnapshotter NewFunc, snap string) cr.Snapshotter {
	s := newSnapshotter(b)
	must(b, s.CreateVolume(b.Context(), "vol"))
	for d := range 10 {
		for f := range 10 {
			writeFile(b, filepath.Join(s.Path("vol"), fmt.Sprintf("d%d/f%d", d, f)), fmt.Sprintf("file %d %d\n", d, f))
		}
	}
	if snap != "" {
		must(b, s.Snapshot(b.Context(), "vol", snap))
	}
	return s
}

// Bench runs the backend benchmarks: snapshot, clone and destroy latency
// of a volume holding a small tree, and Changes latency after a few edits.
func Bench(b *testing.B, newSnapshotter NewFunc) {
	b.Run("Snapshot", func(b *testing.B) {
		s, ctx := smallVolume(b, newSnapshotter, ""), b.Context()
		n := 0
		for b.Loop() {
			must(b, s.Snapshot(ctx, "vol", fmt.Sprintf("snaps/%d", n)))
			n++
		}
	})
	b.Run("Clone", func(b *testing.B) {
		s, ctx := smallVolume(b, newSnapshotter, "image"), b.Context()
		n := 0
		for b.Loop() {
			must(b, s.Clone(ctx, "image", fmt.Sprintf("clones/%d", n)))
			n++
		}
	})
	b.Run("Destroy", func(b *testing.B) {
		s, ctx := smallVolume(b, newSnapshotter, "image"), b.Context()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			name := fmt.Sprintf("clones/%d", i)
			must(b, s.Clone(ctx, "image", name))
			must(b, os.WriteFile(filepath.Join(s.Path(name), "d0/f0"), []byte("dirty"), 0o644))
			b.StartTimer()
			must(b, s.Destroy(ctx, name))
		}
	})
	b.Run("Changes", func(b *testing.B) {
		s, ctx := smallVolume(b, newSnapshotter, "base"), b.Context()
		writeFile(b, filepath.Join(s.Path("vol"), "d1/f1"), "changed")
		writeFile(b, filepath.Join(s.Path("vol"), "d2/new"), "new")
		must(b, os.Remove(filepath.Join(s.Path("vol"), "d3/f3")))
		var got []cr.Change
		for b.Loop() {
			var err error
			got, err = s.Changes(ctx, "base", "vol")
			must(b, err)
		}
		if len(got) != 3 {
			b.Fatalf("Changes: want 3, got %v", got)
		}
	})
}
