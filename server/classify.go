package server

import (
	"context"
	"log/slog"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
)

// Turn is one finished step, as the Classifier sees it.
type Turn struct {
	Tool   string
	Cmd    string // the command the sandbox ran
	Result *sandbox.Result
}

// Classifier decides what a turn's checkpoint must capture: branch.None
// when the turn left no net change, FS, Proc or Full. When in doubt it
// must say Full: a missed change is a correctness bug, an extra checkpoint
// only a cost. The Inspector implements it from eBPF events.
type Classifier interface {
	Classify(ctx context.Context, env *branch.Env, t Turn) branch.Kind
}

// ClassifierFunc adapts a function to Classifier.
type ClassifierFunc func(ctx context.Context, env *branch.Env, t Turn) branch.Kind

// Classify implements Classifier.
func (f ClassifierFunc) Classify(ctx context.Context, env *branch.Env, t Turn) branch.Kind {
	return f(ctx, env, t)
}

// Full is the Classifier of the coordinator's first cut: every turn is
// checkpointed whole.
var Full Classifier = ClassifierFunc(func(context.Context, *branch.Env, Turn) branch.Kind { return branch.Full })

// Inspected is the Classifier backed by the engine's Inspector (eBPF net
// change, or the snapshot backend's change list): none, fs, proc or full
// per turn. Its own failures make the turn full.
func Inspected(e *branch.Engine, log *slog.Logger) Classifier {
	return ClassifierFunc(func(ctx context.Context, env *branch.Env, t Turn) branch.Kind {
		turn, err := e.Classify(ctx, env, t.Cmd)
		if err != nil {
			log.Warn("classify turn", slog.String("env", env.ID), slog.Any("err", err))
			return branch.Full
		}
		log.Debug("turn classified", slog.String("env", env.ID), slog.String("kind", string(turn.Kind)),
			slog.Any("reasons", turn.Reasons), slog.Duration("took", turn.Took))
		return turn.Kind
	})
}
