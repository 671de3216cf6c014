package branch_test

import (
	"context"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
)

// collected waits for the background GC to have removed every state and
// every artifact of e (files included) and, once their states are gone,
// the records of the closed envs; then it checks the manifest. Every env
// of e must be closed.
func collected(t *testing.T, e *branch.Engine, snap cr.Snapshotter) {
	t.Helper()
	ctx := context.Background()
	var u branch.Usage
	branchtest.WaitFor(t, "every state, artifact and env record removed", func() bool {
		var err error
		u, err = e.Usage()
		vols, _ := snap.List(ctx, branch.SnapshotPrefix)
		arts := 0
		for _, k := range u.Manifest.Artifacts {
			arts += k.Count
		}
		return err == nil && u.Manifest.States == 0 && arts == 0 && u.Images.HotCount+u.Images.ColdCount == 0 && len(vols) == 0 &&
			u.Manifest.Envs == 0
	})
	if u.GC.Envs == 0 {
		t.Errorf("GC stats %+v: want env records deleted", u.GC)
	}
	if err := e.CheckManifest(); err != nil {
		t.Error(err)
	}
}

// TestCloseReleases: a graceful Close closes its envs as CloseEnv does
// (docs/engine.md, "Crash safety": they do not come back): after the
// restart their states still branch within the retention, and once it
// is over the GC removes them and their artifacts.
func TestCloseReleases(t *testing.T) {
	r := retainRig(t, time.Hour, nil)
	ctx := context.Background()
	_, sids := numbered(t, r.e, 2)
	if err := r.e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e, err := branch.Open(ctx, r.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	if n := len(e.Envs()); n != 0 {
		t.Fatalf("%d envs back after a graceful Close, want none", n)
	}
	branchCheck(t, e, sids[2], "2")
	branch.AdvanceClock(e, time.Hour+time.Second)
	collected(t, e, r.snap)
}
