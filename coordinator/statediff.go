package coordinator

import (
	"context"
)

// Comparison is two states' records and the paths whose files differ
// between them.
type Comparison struct {
	A, B    StateRecord
	Changes []FileChange
}

// Compare reads states a and b for the web view's diff (package server):
// their records and the paths whose files differ from a to b, as the
// snapshotter compares them. An unknown state is state.ErrUnknownState.
func (c *Coordinator) Compare(ctx context.Context, a, b string) (*Comparison, error) {
	var recs [2]StateRecord
	for i, sid := range []string{a, b} {
		st, err := c.e.State(sid)
		if err != nil {
			return nil, err
		}
		recs[i] = stateRecord(st)
	}
	cs, err := c.e.StateChanges(ctx, a, b)
	if err != nil {
		return nil, err
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
	return c.e.StateFiles(sid)
}
