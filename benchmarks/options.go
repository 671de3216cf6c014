package benchmarks

import (
	"log/slog"
	"time"

	"github.com/arbor-env/arbor/branch"
)

// Options configure a benchmark run. Zero values take the defaults.
type Options struct {
	// TracesDir holds the trace files (default: the traces built in).
	TracesDir string
	// Only keeps the named traces.
	Only []string
	// OutDir receives results.json, results.md and the plots.
	OutDir string
	// Think is the simulated LLM think time between turns (default 200 ms).
	Think time.Duration
	// BranchN are the fan-outs of the branch(n) measurement (default
	// 1, 2, 4, 8, 16, 32) and BranchReps how often each is timed
	// (default 3).
	BranchN    []int
	BranchReps int
	// Tree configures the tree rollouts.
	Tree TreeOptions
	// ReplayStride checks every ReplayStride-th turn by replay (default
	// 2; the replay check costs O(turns^2) actions).
	ReplayStride int
	// SkipRunc leaves the runc baseline out.
	SkipRunc bool
	// TracesOnly plays the traces through Arbor and checks their recovery,
	// nothing else (no baselines, branch(n), runc or tree rollouts): the
	// turn classes and CRIU dumps in about a minute.
	TracesOnly bool
	// ZFS also plays every trace through Arbor on the zfs backend (its
	// own pool file in the state directory, as arbor serve --backend zfs
	// makes it: zfs-fuse started and its shim wired where needed) and
	// times branch(n) there: the report's ZFS column beside btrfs.
	ZFS bool
	// BranchOnly measures branch(n) only: the small (service trace) and
	// the big sandbox from past states, their children's memory, and
	// runc beside them (no baselines, recovery check or tree rollouts).
	BranchOnly bool
	// BigMB is what the big sandbox's process holds (default 256 MiB).
	BigMB int
	// LazyBytes is Arbor's engine's Options.LazyBytes (default
	// branch.DefaultLazyBytes; negative: every restore eager).
	LazyBytes int64
	// WarmCopies is the engine's pre-restored copies per open env (0: none,
	// the default: every branch is a cold restore).
	WarmCopies int
	// WorkDir is where the temporary state directory goes (default: the
	// system temp dir); KeepWorkDir leaves it behind for inspection.
	WorkDir     string
	KeepWorkDir bool
	// CRIU is the CRIU binary (default: the private CRIU 4.x).
	CRIU string
	// InitBinary is arbor-init (default: sandbox.FindInit).
	InitBinary string
	// Classifier picks Arbor's classification: "inspector" (the default:
	// the Inspector when this build wires one into the server, else full)
	// or "full".
	Classifier string
	Logger     *slog.Logger
	// Progress receives one line per finished stage (nil: none).
	Progress func(format string, args ...any)
}

// TreeOptions configure the Tree-GRPO-style rollouts: M trees, each grown
// from a chain of the trace's first Prefix turns (0: the whole trace, as
// Tree-GRPO expands complete trajectories); L rounds, each expanding N
// random nodes of every tree into Factor children that run Steps more
// actions.
type TreeOptions struct {
	Trace   string
	M       int
	Prefix  int
	L       int
	N       int
	Steps   int
	Factors []int
}

func (o Options) withDefaults() Options {
	if o.Think == 0 {
		o.Think = 200 * time.Millisecond
	}
	if len(o.BranchN) == 0 {
		o.BranchN = []int{1, 2, 4, 8, 16, 32}
	}
	if o.BranchReps <= 0 {
		o.BranchReps = 3
	}
	if o.BigMB <= 0 {
		o.BigMB = 256
	}
	if o.LazyBytes == 0 {
		o.LazyBytes = branch.DefaultLazyBytes
	}
	if o.ReplayStride <= 0 {
		o.ReplayStride = 2
	}
	if o.OutDir == "" {
		o.OutDir = "benchmarks/results"
	}
	if o.Classifier == "" {
		o.Classifier = "inspector"
	}
	t := &o.Tree
	if t.Trace == "" {
		t.Trace = "bugfix"
	}
	if t.M <= 0 {
		t.M = 2
	}
	if t.L <= 0 {
		t.L = 2
	}
	if t.N <= 0 {
		t.N = 2
	}
	if t.Steps <= 0 {
		t.Steps = 2
	}
	if len(t.Factors) == 0 {
		t.Factors = []int{1, 2, 3, 4, 5}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	return o
}
