package branch

import (
	"context"
	"fmt"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/state"
)

// StateChanges lists the paths whose files differ between state base and
// state target (their filesystem snapshots, as the backend compares them:
// cr.Snapshotter.Changes), for the web view's diff (docs/ui.md). Both
// states are kept from the GC while it runs; an unknown one is
// state.ErrUnknownState.
func (e *Engine) StateChanges(ctx context.Context, base, target string) ([]cr.Change, error) {
	e.gcMu.RLock()
	e.hold(base)
	e.hold(target)
	defer e.unhold(base)
	defer e.unhold(target)
	var locs [2]string
	for i, sid := range []string{base, target} {
		st, err := e.State(sid)
		if err != nil {
			e.gcMu.RUnlock()
			return nil, err
		}
		a, err := e.man.GetArtifact(st.FS)
		if err != nil {
			e.gcMu.RUnlock()
			return nil, fmt.Errorf("%w: state %s: its file snapshot: %w", state.ErrUnknownState, sid, err)
		}
		locs[i] = a.Location
	}
	e.gcMu.RUnlock()
	if locs[0] == locs[1] {
		return nil, nil // one snapshot: a turn that wrote no file
	}
	return e.o.Snap.Changes(ctx, locs[0], locs[1])
}
