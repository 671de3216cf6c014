package benchmarks

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/cr/manifest"
)

// The modes compared.
const (
	ModeArbor  = "arbor"
	ModeFull   = "full"
	ModeFSOnly = "fsonly"
	ModeReplay = "replay"
	// ModeArborZFS is Arbor on the zfs backend (Options.ZFS).
	ModeArborZFS = "arbor-zfs"
	// ModeArborPrepared is branch(n) of the same past state as ModeArbor
	// after a prepare of n copies of it (untimed, waited for): what a
	// trainer that announces its next expansions gets.
	ModeArborPrepared = "arbor-prepared"
)

// Run plays every trace in every mode, measures branching and tree
// rollouts, and returns the report (Write puts it on disk).
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.withDefaults()
	traces, err := LoadTraces(o.TracesDir, o.Only)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	r, err := newRig(ctx, o, "btrfs")
	if err != nil {
		return nil, err
	}
	defer r.Close()
	rep := &Report{Started: start, ThinkMS: ms(o.Think), Host: hostInfo(), BranchN: o.BranchN}
	if r.inNote != "" {
		rep.Notes = append(rep.Notes, r.inNote)
	}
	if r.in != nil {
		rep.Classifier = "inspector (eBPF)"
		if !r.in.UsesBPF() {
			rep.Classifier = "inspector (btrfs change list, no eBPF)"
		}
	} else {
		rep.Classifier = "full (no inspector)"
	}
	for _, t := range traces {
		if err := r.image(ctx, t.Image); err != nil {
			return nil, fmt.Errorf("image %s: %w", t.Image, err)
		}
		rep.Traces = append(rep.Traces, TraceInfo{Name: t.Name, Description: t.Description, Setup: len(t.Setup), Turns: len(t.Turns)})
	}
	// The arbor mode classifies with the engine's inspector (full without
	// one); the baseline checkpoints every turn whole.
	ha, err := r.serve(ctx, ModeArbor, r.e, nil)
	if err != nil {
		return nil, err
	}
	hf, err := r.serve(ctx, ModeFull, r.base, coordinator.Full)
	if err != nil {
		return nil, err
	}
	if o.BranchOnly {
		if err := r.branchSection(ctx, ha, traces, o, rep); err != nil {
			return nil, err
		}
		rep.DurationS = time.Since(start).Seconds()
		rep.summarize()
		return rep, nil
	}
	if o.TracesOnly {
		for _, t := range traces {
			run, err := r.serverRun(ctx, ha, t, o.Think)
			if err != nil {
				return nil, err
			}
			rep.Runs = append(rep.Runs, *run)
			o.Progress("%s/%s: %d turns, recovery %d/%d", t.Name, ha.name, len(run.Turns), recovered(run.Recovery), len(run.Recovery))
		}
		rep.DurationS = time.Since(start).Seconds()
		rep.summarize()
		return rep, nil
	}
	for _, t := range traces {
		for _, h := range []*serverHandle{ha, hf} {
			run, err := r.serverRun(ctx, h, t, o.Think)
			if err != nil {
				return nil, err
			}
			rep.Runs = append(rep.Runs, *run)
			o.Progress("%s/%s: %d turns, recovery %d/%d", t.Name, h.name, len(run.Turns), recovered(run.Recovery), len(run.Recovery))
		}
		run, err := r.fsOnlyRun(ctx, t, o.Think)
		if err != nil {
			return nil, err
		}
		rep.Runs = append(rep.Runs, *run)
		o.Progress("%s/%s: recovery %d/%d", t.Name, ModeFSOnly, recovered(run.Recovery), len(run.Recovery))
		turns, err := r.playReplay(ctx, t)
		if err == nil {
			err = r.recoverReplay(ctx, t, turns, o.ReplayStride)
		}
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", t.Name, err)
		}
		rep.Runs = append(rep.Runs, TraceRun{Trace: t.Name, Mode: ModeReplay, Turns: turns, Recovery: turns})
		o.Progress("%s/%s: recovery %d/%d", t.Name, ModeReplay, recovered(turns), checked(turns))
	}
	if err := r.branchSection(ctx, ha, traces, o, rep); err != nil {
		return nil, err
	}
	for _, t := range traces {
		if t.Name == o.Tree.Trace {
			if o.Tree.Prefix <= 0 || o.Tree.Prefix > len(t.Turns) {
				o.Tree.Prefix = len(t.Turns)
			}
			rep.Tree = r.treeBench(ctx, ha, t, o.Tree)
			rep.TreeOptions = o.Tree
			o.Progress("tree rollouts done")
		}
	}
	if o.ZFS {
		// Free the btrfs run's sandboxes and CPU before the ZFS one.
		r.Close()
		if err := zfsRun(ctx, o, traces, rep); err != nil {
			return nil, fmt.Errorf("zfs: %w", err)
		}
	}
	rep.DurationS = time.Since(start).Seconds()
	rep.summarize()
	return rep, nil
}

// branchSection times branch(n) of the small state (Arbor, and runc
// beside it) and of the big one, eager and lazy, with the children's
// memory.
func (r *rig) branchSection(ctx context.Context, ha *serverHandle, traces []Trace, o Options, rep *Report) error {
	rep.Branch = map[string]map[int][]float64{}
	small, err := r.branchBench(ctx, ha, traces, o)
	if err != nil {
		return fmt.Errorf("branch scaling: %w", err)
	}
	defer ha.c.CloseEnv(ctx, small.envID)
	rep.Branch[ModeArbor] = small.ms
	if len(small.prepared) > 0 {
		rep.Branch[ModeArborPrepared] = small.prepared
	}
	o.Progress("branch(n) measured")
	if rep.BranchMem, err = r.memBench(ctx, ha, small.sid, o); err != nil {
		return fmt.Errorf("branch by memory: %w", err)
	}
	rep.BranchMem.SmallPhases, rep.BranchMem.SmallPhasesN = small.phases, small.phasesN
	o.Progress("branch(n) of a %d MiB sandbox measured", o.BigMB)
	if !o.SkipRunc {
		rep.Runc = r.runcBench(ctx, o.BranchN, o.BranchReps)
		if rep.Runc.Available {
			rep.Branch["runc"] = rep.Runc.BranchMS
		}
		o.Progress("runc: %s", strings.SplitN(rep.Runc.Note, ";", 2)[0])
	}
	return nil
}

// zfsRun plays every trace through Arbor on a zfs rig (timed, then the
// recovery check) and times branch(n) there, as ModeArborZFS.
func zfsRun(ctx context.Context, o Options, traces []Trace, rep *Report) error {
	r, err := newRig(ctx, o, "zfs")
	if err != nil {
		return err
	}
	defer r.Close()
	for _, t := range traces {
		if err := r.image(ctx, t.Image); err != nil {
			return fmt.Errorf("image %s: %w", t.Image, err)
		}
	}
	h, err := r.serve(ctx, ModeArborZFS, r.e, nil)
	if err != nil {
		return err
	}
	for _, t := range traces {
		run, err := r.serverRun(ctx, h, t, o.Think)
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, *run)
		o.Progress("%s/%s: %d turns, recovery %d/%d", t.Name, h.name, len(run.Turns), recovered(run.Recovery), len(run.Recovery))
	}
	br, err := r.branchBench(ctx, h, traces, o)
	if err != nil {
		return fmt.Errorf("branch scaling: %w", err)
	}
	h.c.CloseEnv(ctx, br.envID)
	rep.Branch[ModeArborZFS] = br.ms
	o.Progress("branch(n) on zfs measured")
	return nil
}

func recovered(ts []Turn) int {
	n := 0
	for _, t := range ts {
		if t.Checked && t.Recovered {
			n++
		}
	}
	return n
}

func checked(ts []Turn) int {
	n := 0
	for _, t := range ts {
		if t.Checked {
			n++
		}
	}
	return n
}

// serverRun plays t through a server twice: timed with think time, then
// probed for the recovery check.
func (r *rig) serverRun(ctx context.Context, h *serverHandle, t Trace, think time.Duration) (*TraceRun, error) {
	start := time.Now()
	envID, turns, err := r.playServer(ctx, h, t, think, false)
	if err != nil {
		return nil, err
	}
	w, err := h.e.Written(envID, start)
	if err != nil {
		return nil, err
	}
	h.c.CloseEnv(ctx, envID)
	proc, fs := w[manifest.ArtifactProc], w[manifest.ArtifactFS]
	run := &TraceRun{Trace: t.Name, Mode: h.name, Turns: turns,
		ProcBytes: proc.Bytes, ProcImages: proc.Count, FSSnapshots: fs.Count}
	envID, rec, err := r.playServer(ctx, h, t, 0, true)
	if err != nil {
		return nil, err
	}
	if err := r.recoverServer(ctx, h, rec); err != nil {
		return nil, fmt.Errorf("recovery %s/%s: %w", t.Name, h.name, err)
	}
	h.c.CloseEnv(ctx, envID)
	run.Recovery = rec
	return run, nil
}

func (r *rig) fsOnlyRun(ctx context.Context, t Trace, think time.Duration) (*TraceRun, error) {
	turns, snaps, err := r.playFSOnly(ctx, t, think, false)
	for _, s := range snaps {
		if s != "" {
			r.snap.Destroy(ctx, s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fs-only %s: %w", t.Name, err)
	}
	run := &TraceRun{Trace: t.Name, Mode: ModeFSOnly, Turns: turns, FSSnapshots: len(turns)}
	rec, snaps, err := r.playFSOnly(ctx, t, 0, true)
	if err == nil {
		err = r.recoverFSOnly(ctx, rec, snaps)
	}
	if err != nil {
		return nil, fmt.Errorf("fs-only recovery %s: %w", t.Name, err)
	}
	run.Recovery = rec
	return run, nil
}

// branchBench times branch(n) of a past state with a live background
// server (the service trace's end state, or the first trace's, the env
// changed and checkpointed once more after it) and returns the state and
// its env, still open (the caller closes it: its states go with it).
func (r *rig) branchBench(ctx context.Context, h *serverHandle, traces []Trace, o Options) (branchRun, error) {
	t := traces[0]
	for _, x := range traces {
		if x.Name == "service" {
			t = x
		}
	}
	envID, _, err := r.playServer(ctx, h, t, 0, false)
	if err != nil {
		return branchRun{}, err
	}
	ok := false
	defer func() {
		if !ok {
			h.c.CloseEnv(ctx, envID)
		}
	}()
	sid, err := pastState(ctx, h, envID)
	if err != nil {
		return branchRun{}, err
	}
	out := branchRun{ms: map[int][]float64{}, sid: sid, envID: envID}
	for _, n := range o.BranchN {
		out.phasesN = max(out.phasesN, n)
	}
	var meter phaseMeter
	for _, n := range o.BranchN {
		for i := 0; i < o.BranchReps; i++ {
			if o.WarmCopies > 0 {
				waitWarm(ctx, h.e, min(n, o.WarmCopies))
			}
			m := &meter
			if n != out.phasesN {
				m = &phaseMeter{}
			}
			var took float64
			var ids []string
			err := m.measure(h.e, n, func() (err error) {
				took, ids, err = timedBranch(ctx, h, sid, n)
				return err
			})
			closeAll(ctx, h, ids)
			if err != nil {
				return out, err
			}
			out.ms[n] = append(out.ms[n], took)
		}
	}
	out.phases = meter.perChild()
	if out.prepared, err = preparedBranches(ctx, h, sid, o); err != nil {
		return out, err
	}
	ok = true
	return out, nil
}

// preparedBranches times branch(n) of sid right after a prepare of n
// copies of it (untimed, waited for); a branch that did not take all n
// prepared copies fails the run, since its time would not be what it
// claims.
func preparedBranches(ctx context.Context, h *serverHandle, sid string, o Options) (map[int][]float64, error) {
	out := map[int][]float64{}
	for _, n := range o.BranchN {
		for i := 0; i < o.BranchReps; i++ {
			if _, err := h.c.Prepare(ctx, []string{sid}, n, true); err != nil {
				return out, fmt.Errorf("prepare %d copies: %w", n, err)
			}
			before, err := h.e.Usage()
			if err != nil {
				return out, err
			}
			took, ids, err := timedBranch(ctx, h, sid, n)
			closeAll(ctx, h, ids)
			if err != nil {
				return out, fmt.Errorf("prepared %w", err)
			}
			after, err := h.e.Usage()
			if err != nil {
				return out, err
			}
			if got := after.Prepare.Taken - before.Prepare.Taken; got != int64(n) {
				return out, fmt.Errorf("prepared branch(%d) took %d prepared copies, want %d", n, got, n)
			}
			out[n] = append(out[n], took)
		}
	}
	return out, nil
}

// branchRun is what branchBench measured.
type branchRun struct {
	ms         map[int][]float64
	prepared   map[int][]float64 // the same after a prepare of n copies
	sid, envID string            // the past state branched, and its env (open)
	// phases: restore phase -> ms per child of branch(phasesN)
	phases  map[string]float64
	phasesN int
}

func waitWarm(ctx context.Context, e *branch.Engine, n int) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if u, err := e.Usage(); err == nil && u.Warm >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hostInfo() string {
	var u unix.Utsname
	unix.Uname(&u)
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, Linux %s, %d cores", host, unix.ByteSliceToString(u.Release[:]), runtime.NumCPU())
}
