package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/state"
)

// The records of envs and states, as the web view's lineage trees read
// them (package server/ui).

// EnvRecord is an env the engine keeps a record of (open or closed).
type EnvRecord struct {
	ID, Origin, Head string
	// Served: handed out by a coordinator; Task and Base (the engine's
	// turn count when its episode began) are then its.
	Served bool
	Task   string
	Base   int
}

// EnvRecords returns the records of the envs ctx's tenant sees.
func (c *Coordinator) EnvRecords(ctx context.Context) ([]EnvRecord, error) {
	recs, err := c.e.EnvRecords()
	if err != nil {
		return nil, err
	}
	t := tenant.From(ctx)
	out := make([]EnvRecord, 0, len(recs))
	for _, r := range recs {
		served := r.Labels[labelServed] == "1"
		if owner, ok := r.Labels[labelTenant]; (ok || served) && !t.Sees(owner) {
			continue // another tenant's: as if never made
		}
		task, base, _ := fromLabels(r.Labels)
		out = append(out, EnvRecord{ID: r.ID, Origin: r.Origin, Head: r.Head, Served: served, Task: task.Name, Base: base})
	}
	return out, nil
}

// StateRecord is what the engine recorded of a committed state.
type StateRecord struct {
	ID, Env, Parent string
	Turn            int // the engine's count of its env's turns
	Kind            state.Kind
	Created         time.Time
	// Proc is its process image; ShellDigest and ShellDelta mark a shell
	// delta state (docs/engine.md, "Shell delta states").
	Proc, ShellDigest, ShellDelta string
}

// StateRecords returns the states env made (none: no record).
func (c *Coordinator) StateRecords(env string) ([]StateRecord, error) {
	sts, err := c.e.States(env)
	if errors.Is(err, manifest.ErrNotFound) {
		return nil, nil
	}
	return stateRecords(sts), err
}

// LineageRecords returns state sid and its ancestors.
func (c *Coordinator) LineageRecords(sid string) ([]StateRecord, error) {
	l, err := c.e.Lineage(sid)
	return stateRecords(l), err
}

func stateRecords(sts []manifest.State) []StateRecord {
	out := make([]StateRecord, len(sts))
	for i, st := range sts {
		out[i] = stateRecord(st)
	}
	return out
}

func stateRecord(st manifest.State) StateRecord {
	return StateRecord{ID: st.ID, Env: st.Env, Parent: st.Parent, Turn: st.Turn, Kind: st.Kind, Created: st.Created,
		Proc: st.Proc, ShellDigest: st.ShellDigest, ShellDelta: st.ShellDelta}
}

// Reward is the newest verdict's reward on state sid (nil: none).
func (c *Coordinator) Reward(sid string) *float64 {
	if c.trail == nil {
		return nil
	}
	v, ok, err := c.trail.Verdict(sid)
	if err != nil || !ok {
		return nil
	}
	return &v.Reward
}
