package coordinator

import (
	"context"
	"errors"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/state"
)

// StateRecord is what the engine recorded of a state.
type StateRecord struct {
	ID, Env string
	Turn    int // the engine's count of its env's turns
	Kind    state.Kind
	// Proc is its process image; ShellDigest and ShellDelta mark a shell
	// delta state (docs/engine.md, "Shell delta states").
	Proc, ShellDigest, ShellDelta string
}

// Comparison is two states' records and the paths whose files differ
// between them.
type Comparison struct {
	A, B    StateRecord
	Changes []FileChange
}

// Compare reads states a and b for the web view's diff (package server):
// their records and the paths whose files differ from a to b, as the
// snapshotter compares them. An unknown state is ErrUnknownState.
func (c *Coordinator) Compare(ctx context.Context, a, b string) (*Comparison, error) {
	var recs [2]StateRecord
	for i, sid := range []string{a, b} {
		st, err := c.e.State(sid)
		if err != nil {
			return nil, unknownState(err)
		}
		recs[i] = StateRecord{ID: st.ID, Env: st.Env, Turn: st.Turn, Kind: state.Kind(st.Kind),
			Proc: st.Proc, ShellDigest: st.ShellDigest, ShellDelta: st.ShellDelta}
	}
	cs, err := c.e.StateChanges(ctx, a, b)
	if err != nil {
		return nil, unknownState(err)
	}
	out := &Comparison{A: recs[0], B: recs[1], Changes: make([]FileChange, len(cs))}
	for i, ch := range cs {
		out.Changes[i] = FileChange{Path: ch.Path, Kind: string(ch.Kind)}
	}
	return out, nil
}

// StateFiles returns the host directory that holds state sid's files,
// kept from the GC until release is called (Engine.StateFiles). An
// unknown state is ErrUnknownState.
func (c *Coordinator) StateFiles(sid string) (dir string, release func(), err error) {
	dir, release, err = c.e.StateFiles(sid)
	return dir, release, unknownState(err)
}

// unknownState makes the engine's unknown state the coordinator's too,
// its text unchanged.
func unknownState(err error) error {
	if errors.Is(err, branch.ErrUnknownState) && !errors.Is(err, ErrUnknownState) {
		return state.Errorf(ErrUnknownState, "%w", err)
	}
	return err
}
