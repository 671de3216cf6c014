package branch_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/arbor-env/arbor/state"
)

// TestDeltaImages: with delta images on (a chain of at most 2), each
// checkpoint's process image is a delta of its parent state's until the
// chain is 2 long, then whole again; every delta is smaller than the dump
// it came from and records its base; a branch from every state, through
// its chain, is exact (shell variables, files, and a background process's
// in-memory counter); a shipment of a delta state to another engine
// arrives whole and restores there; closing the envs lets GC take every
// image of the chains.
func TestDeltaImages(t *testing.T) {
	dir := t.TempDir()
	r := newRigOptions(t, newBtrfs(t, dir), dir, func(o *branch.Options) { o.DeltaChain = 2 })
	img := testImage(t, r)
	ctx := context.Background()
	e := r.e
	env, first, err := e.NewEnv(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	start, read := counterCmd(img)
	run(t, e, env, start)
	type point struct {
		sid     string
		counter string
	}
	var pts []point
	for i := range 5 {
		run(t, e, env, fmt.Sprintf("export V%d=%d; echo %d > /f", i, i, i))
		c := strings.TrimSpace(run(t, e, env, read))
		sid, err := e.Checkpoint(ctx, env, state.Full)
		if err != nil {
			t.Fatal(err)
		}
		pts = append(pts, point{sid, c})
	}
	// The chain: first's image whole; then depth 1, 2, whole, 1, 2.
	wantBase := []bool{true, true, false, true, true}
	prevProc := mustState(t, e, first).Proc
	for i, p := range pts {
		st := mustState(t, e, p.sid)
		a, err := branch.Artifact(e, st.Proc)
		if err != nil {
			t.Fatal(err)
		}
		onDisk, err := imgdelta.Base(filepath.Join(r.opts.StateDir, "images", "hot", a.Location))
		if err != nil {
			t.Fatal(err)
		}
		if !wantBase[i] {
			if a.Base != "" || onDisk != "" {
				t.Errorf("state %d: image %s is a delta of %q (link %q); want whole at the chain's end", i, a.ID, a.Base, onDisk)
			}
		} else {
			pa, err := branch.Artifact(e, prevProc)
			if err != nil {
				t.Fatal(err)
			}
			if a.Base != prevProc || onDisk != pa.Location {
				t.Errorf("state %d: image %s base %q (link %q), want the parent state's %s", i, a.ID, a.Base, onDisk, prevProc)
			}
			if a.Whole <= a.Bytes {
				t.Errorf("state %d: delta image of %d bytes from a dump of %d: want it smaller", i, a.Bytes, a.Whole)
			}
		}
		prevProc = st.Proc
	}
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Coord.DeltaImages != 4 || u.Coord.DeltaSaved <= 0 {
		t.Errorf("Usage: %d delta images saving %d bytes; want 4 and some", u.Coord.DeltaImages, u.Coord.DeltaSaved)
	}
	// Each state, branched: the shell, the file and the counter, which
	// answers one more than it did before its checkpoint.
	for i, p := range pts {
		res, err := e.Branch(ctx, branch.Source{State: p.sid}, 1)
		if err != nil || res.Errors[0] != nil {
			t.Fatalf("branch state %d: %v %v", i, err, res.Errors)
		}
		c := res.Children[0]
		got := run(t, e, c, fmt.Sprintf("echo $V0 $V%d; cat /f", i))
		if want := fmt.Sprintf("0 %d\n%d\n", i, i); got != want {
			t.Errorf("child of state %d: %q, want %q", i, got, want)
		}
		n := 0
		fmt.Sscan(p.counter, &n)
		if got := strings.TrimSpace(run(t, e, c, read)); got != fmt.Sprint(n+1) {
			t.Errorf("child of state %d: counter %s, want %d (it answered %s before the checkpoint)", i, got, n+1, p.counter)
		}
		if err := e.CloseEnv(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Shipped to another engine, the last state (a delta) arrives whole.
	dir2 := t.TempDir()
	r2 := newRig(t, newBtrfs(t, dir2), dir2, 0)
	last := pts[len(pts)-1].sid
	var buf bytes.Buffer
	if _, err := e.Export(ctx, last, nil, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.e.Import(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	st2 := mustState(t, r2.e, last)
	a2, err := branch.Artifact(r2.e, st2.Proc)
	if err != nil {
		t.Fatal(err)
	}
	if a2.Base != "" || a2.Whole != 0 {
		t.Errorf("imported image: base %q, whole %d; want a whole image", a2.Base, a2.Whole)
	}
	res, err := r2.e.Branch(ctx, branch.Source{State: last}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch the imported state: %v %v", err, res.Errors)
	}
	if got := run(t, r2.e, res.Children[0], "echo $V0 $V4; cat /f"); got != "0 4\n4\n" {
		t.Errorf("child of the imported state: %q", got)
	}
	r2.e.CloseEnv(ctx, res.Children[0])
	// Closed, the lineage and its chains go.
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if u, _ := e.Usage(); u.Manifest.States != 0 || u.Images.HotCount+u.Images.ColdCount != 0 {
		t.Errorf("GC left %d states, %d+%d images", u.Manifest.States, u.Images.HotCount, u.Images.ColdCount)
	}
}
