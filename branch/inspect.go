package branch

import (
	"context"
	"log/slog"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// Inspector is what the engine needs of the Inspector (docs/engine.md,
// "Packages"): per-environment bookkeeping kept in step with turns,
// checkpoints and restores. *watch.Inspector implements it; the engine
// does not import it, so it does not pull in the eBPF tracker.
type Inspector interface {
	// Track starts watching envID's sandbox, whose cgroup is cgroupID.
	Track(envID string, cgroupID uint64) error
	// Untrack stops watching envID.
	Untrack(envID string)
	// Baseline records t as envID's last checkpoint (after a start or
	// restore, when the live state equals the artifacts); image is the
	// shell state the process image holds when a shell delta was run on
	// it, nil otherwise.
	Baseline(ctx context.Context, envID string, t inspector.Target, image *inspector.ShellState) error
	// BeginTurn marks the start of a turn of envID.
	BeginTurn(envID string) error
	// EndTurn classifies the turn since BeginTurn.
	EndTurn(ctx context.Context, envID string, t inspector.Target) (inspector.Result, error)
	// Settle re-checks, with the sandbox frozen, what a checkpoint of kind
	// k must capture; it returns the kind to take and why.
	Settle(ctx context.Context, envID string, k state.Kind, t inspector.Target) (state.Kind, []string, error)
	// Checkpointed records that a checkpoint of kind k of t was taken.
	Checkpointed(envID string, k state.Kind, t inspector.Target) error
	// TakeShellDelta returns the shell delta that can stand for the
	// process image of the checkpoint being taken (the turn changed the
	// processes only through the shell's own state), and false when a
	// dump is needed. Called frozen, after Settle; Checkpointed then gets
	// the kind of the other artifacts (docs/engine.md, "Shell delta
	// states").
	TakeShellDelta(envID string) (inspector.Delta, bool)
}

// Turn is what Classify found about a turn.
type Turn struct {
	Kind    state.Kind
	Reasons []string
	Took    time.Duration
}

// target tells the inspector where env's state lives: its sandbox, its
// live root and the snapshot of its head's filesystem artifact.
func (e *Engine) target(sb *sandbox.Sandbox, volume, fsLoc, cmd string) inspector.Target {
	t := inspector.Target{Shell: sb, Cgroup: sb.FreezerCgroup(), LiveRoot: e.o.Snap.Path(volume), Command: cmd}
	if fsLoc != "" {
		t.SnapshotRoot = e.o.Snap.Path(fsLoc)
		t.Changes = func(ctx context.Context) ([]cr.Change, error) { return e.o.Snap.Changes(ctx, fsLoc, volume) }
	}
	return t
}

func (env *Env) headFS() string {
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	return env.fsLoc
}

func (env *Env) setHeadFS(loc string) {
	env.fsMu.Lock()
	env.fsLoc = loc
	env.fsMu.Unlock()
}

// track starts the inspector's bookkeeping for a sandbox that was just
// started or restored (its live state equals its artifacts: fsLoc).
// image is the shell state of the restored process image when a shell
// delta was run on it (restored.imageShell), nil otherwise.
func (e *Engine) track(ctx context.Context, env *Env, image *inspector.ShellState) {
	if err := e.trackSandbox(ctx, env.ID, env.sb, env.volume, env.headFS(), image); err != nil {
		// Without a baseline the inspector classifies conservatively
		// (full), so this costs checkpoints, not correctness.
		e.log.Warn("inspector baseline", slog.String("env", env.ID), slog.Any("err", err))
	}
}

// trackSandbox is track for sandbox sb of the env called id (that env
// need not exist yet: a warm copy is tracked under the id it will have).
// Without an inspector it does nothing.
func (e *Engine) trackSandbox(ctx context.Context, id string, sb *sandbox.Sandbox, volume, fsLoc string, image *inspector.ShellState) error {
	in := e.o.Inspector
	if in == nil {
		return nil
	}
	cg, err := sb.CgroupID()
	if err == nil {
		err = in.Track(id, cg)
	}
	if err == nil {
		err = in.Baseline(ctx, id, e.target(sb, volume, fsLoc, ""), image)
	}
	return err
}

// trackWarm takes a warm copy's baseline before it is frozen, under the
// env id it will have, so that a branch taking it only thaws it (the
// baseline's shell round trip and process sample are background work,
// docs/engine.md, "Warm copies"). It reports whether the copy is tracked;
// when not, its adoption tracks it as any restore.
func (e *Engine) trackWarm(ctx context.Context, id string, r restored) bool {
	if e.o.Inspector == nil {
		return false
	}
	// The Inspector without eBPF compares a process's CPU time exactly,
	// which the freeze and thaw move: its copies take their baseline
	// once thawed, as before.
	if p, ok := e.o.Inspector.(interface{ UsesBPF() bool }); ok && !p.UsesBPF() {
		return false
	}
	if err := e.trackSandbox(ctx, id, r.sb, r.volume, r.fsLoc, r.imageShell); err != nil {
		e.log.Warn("warm copy's inspector baseline", slog.String("env", id), slog.Any("err", err))
		e.o.Inspector.Untrack(id)
		return false
	}
	return true
}

// untrack stops the inspector's bookkeeping of id.
func (e *Engine) untrack(id string) {
	if in := e.o.Inspector; in != nil {
		in.Untrack(id)
	}
}

// Classify returns what env's last turn changed (none, fs, proc or full)
// for the coordinator to checkpoint. Without an inspector it is full.
// cmd is the turn's command text, if any.
func (e *Engine) Classify(ctx context.Context, env *Env, cmd string) (Turn, error) {
	in := e.o.Inspector
	if in == nil {
		return Turn{Kind: state.Full, Reasons: []string{"no inspector"}}, nil
	}
	start := time.Now()
	env.mu.Lock()
	defer env.mu.Unlock()
	if err := env.usable(); err != nil {
		return Turn{}, err
	}
	if _, err := env.gate(ctx); err != nil {
		return Turn{}, err
	}
	r, err := in.EndTurn(ctx, env.ID, e.target(env.sb, env.volume, env.headFS(), cmd))
	if err != nil {
		// The inspector's own failure: checkpoint everything.
		return Turn{Kind: state.Full, Reasons: append(r.Reasons, err.Error()), Took: time.Since(start)}, nil
	}
	return Turn{Kind: r.Kind, Reasons: r.Reasons, Took: time.Since(start)}, nil
}
