package benchmarks

import (
	"context"
	"fmt"
	"time"

	"github.com/arbor-env/arbor/branch"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/memhold"
)

// memSettle is how long after a branch the children's memory is read a
// second time (a lazy restore's daemon has copied everything by then).
const memSettle = 10 * time.Second

// pastState checkpoints env and then changes and checkpoints it again, so
// the state it returns is a past one: not the head, no warm copy of it.
func pastState(ctx context.Context, h *serverHandle, envID string) (string, error) {
	sid, err := h.c.Checkpoint(ctx, envID)
	if err != nil {
		return "", err
	}
	if _, err := h.c.Step(ctx, envID, arbor.Bash("echo later >> /tmp/bench-later", time.Minute)); err != nil {
		return "", fmt.Errorf("%w: step after the branched state: %v", ErrStep, err)
	}
	if _, err := h.c.Checkpoint(ctx, envID); err != nil {
		return "", err
	}
	return sid, nil
}

// memBench times branch(n) (n up to bigMaxN) of a past state of a debian
// sandbox whose Python process holds o.BigMB MiB of touched memory,
// restored eagerly and lazily on the same engine, beside the small state
// (the one branchBench timed) again, and reads the children's memory for
// all three at n = MemN.
func (r *rig) memBench(ctx context.Context, h *serverHandle, small string, o Options) (*BranchMem, error) {
	bm := &BranchMem{BigMB: o.BigMB, MS: map[string]map[int][]float64{},
		Memory: map[string]ChildMemory{}, ImageBytes: map[string]int64{}, ImageStored: map[string]int64{}, PhaseNames: branch.RestorePhaseNames()}
	if err := r.image(ctx, "debian"); err != nil {
		return nil, err
	}
	rr, err := h.c.Reset(ctx, arbor.ResetParams{Image: "debian"})
	if err != nil {
		return nil, fmt.Errorf("%w: reset debian: %v", ErrStep, err)
	}
	defer h.c.CloseEnv(ctx, rr.EnvID)
	res, err := h.c.Step(ctx, rr.EnvID, arbor.Bash(memhold.Start(o.BigMB), 2*time.Minute))
	if err != nil || res.Obs.ExitCode != 0 {
		return nil, fmt.Errorf("%w: start the %d MiB process: %v %+v", ErrStep, o.BigMB, err, res)
	}
	big, err := pastState(ctx, h, rr.EnvID)
	if err != nil {
		return nil, err
	}
	for v, sid := range map[string]string{BranchSmall: small, BranchBigEager: big, BranchBigLazy: big} {
		stored, whole, err := h.e.ImageBytes(sid)
		if err != nil {
			return nil, fmt.Errorf("process image of %s: %w", sid, err)
		}
		bm.ImageBytes[v], bm.ImageStored[v] = whole, stored
	}
	lazy := o.LazyBytes
	if lazy <= 0 {
		lazy = branch.DefaultLazyBytes
	}
	defer h.e.SetLazyBytes(o.LazyBytes)
	setLazy := func(v string) {
		if v == BranchBigLazy {
			h.e.SetLazyBytes(lazy)
		} else {
			h.e.SetLazyBytes(0)
		}
	}
	bm.MemN = min(8, bigMaxN)
	for _, n := range o.BranchN {
		if n <= bigMaxN {
			bm.MemN = n // the largest fan-out timed, at most bigMaxN
		}
	}
	// The variants take turns, rep by rep, so that a change in the
	// machine's load (it is shared) falls on all three alike.
	meters := map[string]*phaseMeter{}
	for _, v := range branchVariants {
		bm.MS[v] = map[int][]float64{}
		meters[v] = &phaseMeter{}
	}
	for _, n := range o.BranchN {
		if n > bigMaxN {
			continue
		}
		for i := 0; i < o.BranchReps; i++ {
			for _, v := range branchVariants {
				setLazy(v)
				sid := big
				if v == BranchSmall {
					sid = small
				}
				var took float64
				var ids []string
				m := meters[v]
				if n != bm.MemN {
					m = &phaseMeter{} // only branch(MemN)'s count
				}
				err := m.measure(h.e, n, func() (err error) {
					took, ids, err = timedBranch(ctx, h, sid, n)
					return err
				})
				closeAll(ctx, h, ids)
				if err != nil {
					return nil, err
				}
				bm.MS[v][n] = append(bm.MS[v][n], took)
			}
		}
	}
	bm.Phases = map[string]map[string]float64{}
	for _, v := range branchVariants {
		bm.Phases[v] = meters[v].perChild()
	}
	for _, v := range branchVariants {
		setLazy(v)
		sid := big
		if v == BranchSmall {
			sid = small
		}
		m, err := r.childMemory(ctx, h, sid, bm.MemN)
		if err != nil {
			return nil, fmt.Errorf("memory of %s children: %w", v, err)
		}
		bm.Memory[v] = m
	}
	return bm, nil
}

// phaseMeter sums the engine's restore phase times over some branches.
type phaseMeter struct {
	children int
	ms       map[string]float64
}

// measure runs f and adds the engine's restore phase times during it,
// for n children.
func (m *phaseMeter) measure(e *branch.Engine, n int, f func() error) error {
	u0, _ := e.Usage()
	err := f()
	u1, _ := e.Usage()
	if m.ms == nil {
		m.ms = map[string]float64{}
	}
	for k, d := range u1.Coord.RestorePhases {
		m.ms[k] += ms(d - u0.Coord.RestorePhases[k])
	}
	m.children += n
	return err
}

// perChild is the meter's times divided by its children.
func (m *phaseMeter) perChild() map[string]float64 {
	out := map[string]float64{}
	for k, v := range m.ms {
		out[k] = v / float64(max(m.children, 1))
	}
	return out
}

// timedBranch runs branch(n) of sid and returns its time (ms) and the
// children's ids; a failed child is an error.
func timedBranch(ctx context.Context, h *serverHandle, sid string, n int) (float64, []string, error) {
	start := time.Now()
	br, err := h.c.Branch(ctx, arbor.BranchParams{StateID: sid, N: n})
	took := ms(time.Since(start))
	if err != nil {
		return 0, nil, fmt.Errorf("branch(%d): %w", n, err)
	}
	for j, id := range br.EnvIDs {
		if id == "" {
			return 0, br.EnvIDs, fmt.Errorf("branch(%d) child %d: %v", n, j, br.Errors)
		}
	}
	return took, br.EnvIDs, nil
}

func closeAll(ctx context.Context, h *serverHandle, ids []string) {
	for _, id := range ids {
		if id != "" {
			h.c.CloseEnv(ctx, id)
		}
	}
}

// childMemory branches sid n ways and returns the mean memory charged per
// child right after the branch and memSettle later.
func (r *rig) childMemory(ctx context.Context, h *serverHandle, sid string, n int) (ChildMemory, error) {
	var m ChildMemory
	u0, _ := h.e.Usage()
	_, ids, err := timedBranch(ctx, h, sid, n)
	defer closeAll(ctx, h, ids)
	if err != nil {
		return m, err
	}
	read := func() (cur, anon float64, err error) {
		for _, id := range ids {
			env, err := h.e.Env(id)
			if err != nil {
				return 0, 0, err
			}
			mm, err := env.Sandbox().Memory()
			if err != nil {
				return 0, 0, err
			}
			cur += float64(mm.Current) / float64(len(ids)) / (1 << 20)
			anon += float64(mm.Anon) / float64(len(ids)) / (1 << 20)
		}
		return cur, anon, nil
	}
	if m.AfterMiB, m.AnonAfterMiB, err = read(); err != nil {
		return m, err
	}
	u1, _ := h.e.Usage()
	m.LazyRestores = u1.Coord.LazyRestores - u0.Coord.LazyRestores
	select {
	case <-time.After(memSettle):
	case <-ctx.Done():
		return m, ctx.Err()
	}
	m.After10sMiB, m.Anon10sMiB, err = read()
	return m, err
}
