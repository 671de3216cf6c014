package watch

import (
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/state"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/bpf"
)

// Options configure an Inspector.
type Options struct {
	Logger *slog.Logger
	// MaxCompareBytes bounds the file content the comparisons of one
	// EndTurn or Settle read (both trees counted); a touched file past it
	// counts as changed. 0 means inspector.DefaultMaxRead (256 MiB); less
	// than 0 reads nothing (any regular file whose metadata match counts
	// as changed).
	MaxCompareBytes int64
	// MaxScan bounds the descriptors and mapping lines of the sandbox's
	// processes one EndTurn, Settle or Checkpointed reads; a turn whose
	// processes hold more is unaccounted (a full checkpoint). 0 means
	// DefaultMaxScan.
	MaxScan int
}

// Inspector classifies the turns of the environments it tracks.
type Inspector struct {
	log     *slog.Logger
	tr      *bpf.Tracker // nil without eBPF
	maxRead int64        // Options.MaxCompareBytes, resolved
	maxScan int          // Options.MaxScan

	mu     sync.Mutex
	envs   map[string]*envState
	byCg   map[uint64]*envState
	closed bool

	flushMu sync.Mutex // one flush at a time
	flushed chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
	events  uint64
}

// envState is what the inspector keeps per environment; guarded by mu.
type envState struct {
	id  string
	cg  uint64
	log *slog.Logger
	// since: events before it (CLOCK_MONOTONIC ns) are already in the last
	// filesystem artifact.
	since uint64
	// touched: paths possibly changed since the last filesystem artifact;
	// timed: those a call set the times of (a directory's are compared).
	touched map[string]struct{}
	timed   map[string]struct{}
	// unaccounted: reasons that force the next checkpoint to be full.
	unaccounted []string
	lostBase    uint64
	// procBase: long-lived processes at the last process artifact; nil
	// when unknown.
	procBase []inspector.ProcSample
	haveProc bool
	// shellBase is the shell state of the last state checkpointed (a
	// process image, or one and a shell delta); shell is the latest one
	// read (what a checkpoint taken now captures); imageShell is the
	// shell the last process image holds, what a shell delta applies on.
	shellBase, shell, imageShell inspector.ShellState
	// delta is the shell delta of the last turn, when its only process
	// change was the shell's state (TakeShellDelta).
	delta     *pendingDelta
	turnStart time.Time
	// effects and objects: effect calls and stream objects since the
	// last process artifact (kernelFacts); procSince: events before it
	// (CLOCK_MONOTONIC ns) are in that artifact.
	effects   []string
	objects   map[objKey]Object
	procSince uint64
}

// pendingDelta is a shell delta and the shell state it reaches.
type pendingDelta struct {
	d     inspector.Delta
	shell inspector.ShellState
}

// New loads the eBPF programs and returns an inspector that uses them.
// When eBPF cannot be used the error wraps ErrUnavailable (and
// bpf.ErrUnavailable); NewFallback then gives a working inspector.
func New(o Options) (*Inspector, error) {
	tr, err := bpf.Open()
	if err != nil {
		if errors.Is(err, bpf.ErrUnavailable) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, err
	}
	in := newInspector(o, tr)
	in.wg.Add(1)
	go in.read()
	return in, nil
}

// NewFallback returns an inspector without eBPF: files come from the
// backend's change list (Target.Changes), and any CPU time of a long-lived
// process counts as a process change.
func NewFallback(o Options) *Inspector { return newInspector(o, nil) }

func newInspector(o Options, tr *bpf.Tracker) *Inspector {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	maxRead := o.MaxCompareBytes
	if maxRead == 0 {
		maxRead = inspector.DefaultMaxRead
	}
	return &Inspector{log: o.Logger, tr: tr, maxRead: maxRead, maxScan: o.MaxScan, envs: map[string]*envState{}, byCg: map[uint64]*envState{}, stop: make(chan struct{})}
}

// UsesBPF reports whether the inspector watches through eBPF.
func (in *Inspector) UsesBPF() bool { return in.tr != nil }

// Close stops watching every environment.
func (in *Inspector) Close() error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	in.mu.Unlock()
	close(in.stop)
	var err error
	if in.tr != nil {
		err = in.tr.Close() // unblocks read
	}
	in.wg.Wait()
	return err
}

func monotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// Track starts watching environment envID, whose sandbox is in cgroup
// cgroupID (Sandbox.CgroupID). Call it when a sandbox is created or
// restored, before it runs anything of the environment's, then Baseline.
// Tracking an env again replaces its cgroup (a rollback's new sandbox).
func (in *Inspector) Track(envID string, cgroupID uint64) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return ErrClosed
	}
	if old, ok := in.envs[envID]; ok {
		delete(in.byCg, old.cg)
		if in.tr != nil && old.cg != cgroupID {
			in.tr.Untrack(old.cg)
		}
	}
	if in.tr != nil {
		if err := in.tr.Track(cgroupID); err != nil {
			return err
		}
	}
	now := monotonicNow()
	st := &envState{id: envID, cg: cgroupID, log: in.log.With(slog.String("env", envID)),
		touched: map[string]struct{}{}, timed: map[string]struct{}{}, since: now, objects: map[objKey]Object{}, procSince: now}
	st.lostBase = in.lostLocked()
	st.unaccounted = []string{"no baseline yet"}
	in.envs[envID] = st
	in.byCg[cgroupID] = st
	return nil
}

// Untrack stops watching envID (its sandbox was destroyed).
func (in *Inspector) Untrack(envID string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	st, ok := in.envs[envID]
	if !ok {
		return
	}
	delete(in.envs, envID)
	delete(in.byCg, st.cg)
	if in.tr != nil {
		if err := in.tr.Untrack(st.cg); err != nil {
			st.log.Warn("untrack cgroup", slog.Any("err", err))
		}
	}
}

// BeginTurn marks the start of a turn: writes through files already open
// are reported again from now on.
func (in *Inspector) BeginTurn(envID string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	st, ok := in.envs[envID]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownEnv, envID)
	}
	st.turnStart = time.Now()
	// A delta describes the shell at the end of the last turn only.
	st.delta = nil
	if in.tr != nil {
		return in.tr.NewEpoch(st.cg)
	}
	return nil
}

func (in *Inspector) lostLocked() uint64 {
	if in.tr == nil {
		return 0
	}
	n, _ := in.tr.Lost()
	return n
}

// read moves events from the ring buffer into the environments' states.
func (in *Inspector) read() {
	defer in.wg.Done()
	for {
		e, err := in.tr.Read()
		switch {
		case errors.Is(err, bpf.ErrFlushed):
			in.mu.Lock()
			if in.flushed != nil {
				close(in.flushed)
				in.flushed = nil
			}
			in.mu.Unlock()
			continue
		case errors.Is(err, bpf.ErrClosed):
			return
		case err != nil:
			select {
			case <-in.stop:
				return
			default:
			}
			in.log.Warn("read eBPF event", slog.Any("err", err))
			continue
		}
		in.apply(e)
	}
}

func (in *Inspector) apply(e bpf.Event) {
	if effect, unacc, obj, ok := EventKernel(e); ok {
		in.applyKernel(e, effect, unacc, obj)
		return
	}
	paths, why := EventPaths(e)
	if len(paths) == 0 && why == "" {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.events++
	st, ok := in.byCg[e.CgroupID]
	if !ok || e.TS < st.since {
		return
	}
	timed := timesCalls[bpf.Syscall[e.Nr]]
	for _, p := range paths {
		st.touched[p] = struct{}{}
		if timed {
			st.timed[p] = struct{}{}
		}
	}
	if why != "" && len(st.unaccounted) < inspector.MaxReasons {
		st.unaccounted = append(st.unaccounted, why)
	}
}

// applyKernel records an effect call, an unaccounted one or a stream
// object of event e.
func (in *Inspector) applyKernel(e bpf.Event, effect, unacc string, obj *Object) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.events++
	st, ok := in.byCg[e.CgroupID]
	if !ok || e.TS < st.procSince {
		return
	}
	switch {
	case unacc != "":
		if len(st.unaccounted) < inspector.MaxReasons {
			st.unaccounted = append(st.unaccounted, unacc)
		}
	case effect != "":
		if len(st.effects) < inspector.MaxReasons {
			st.effects = append(st.effects, effect)
		}
	case obj != nil:
		if e.Flags&bpf.FlagFDFile != 0 && e.Flags&bpf.FlagOutside1 == 0 && strings.HasPrefix(e.Path[1], "/") && e.TS >= st.since {
			// A named FIFO: its times moved.
			for _, p := range inspector.SnapshotPath(e.Path[1]) {
				st.touched[p] = struct{}{}
			}
		}
		if len(st.objects) >= maxObjects {
			if len(st.effects) < inspector.MaxReasons {
				st.effects = append(st.effects, fmt.Sprintf("more than %d pipes, sockets and locked files used", maxObjects))
			}
			return
		}
		if _, seen := st.objects[keyOf(*obj)]; !seen {
			st.objects[keyOf(*obj)] = *obj
		}
	}
}

// sync waits until every event emitted before the call has been applied.
func (in *Inspector) sync(ctx context.Context) error {
	if in.tr == nil {
		return nil
	}
	in.flushMu.Lock()
	defer in.flushMu.Unlock()
	ch := make(chan struct{})
	in.mu.Lock()
	in.flushed = ch
	in.mu.Unlock()
	if err := in.tr.Flush(); err != nil {
		return fmt.Errorf("flush eBPF events: %w", err)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
		return fmt.Errorf("flush eBPF events: no answer in 5s")
	}
}

// EndTurn returns the net change of envID since its last checkpoint of
// each part (the turn that just ended, plus anything earlier turns left
// that no checkpoint took yet). Call it when the turn's command returned;
// the shell must be idle, as ShellQuery runs in it.
func (in *Inspector) EndTurn(ctx context.Context, envID string, t inspector.Target) (inspector.Result, error) {
	if err := in.sync(ctx); err != nil {
		return inspector.Result{Kind: state.Full, Reasons: []string{err.Error() + " -> full"}}, err
	}
	in.mu.Lock()
	st, ok := in.envs[envID]
	if !ok {
		in.mu.Unlock()
		return inspector.Result{}, fmt.Errorf("%w: %s", ErrUnknownEnv, envID)
	}
	var facts []inspector.Fact
	for _, why := range st.unaccounted {
		facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: why})
	}
	if lost := in.lostLocked(); lost > st.lostBase {
		facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: fmt.Sprintf("lost events (%d)", lost-st.lostBase)})
	}
	touched := make([]string, 0, len(st.touched))
	for p := range st.touched {
		touched = append(touched, p)
	}
	timed := maps.Clone(st.timed)
	procBase, haveProc, shellBase, imageShell := st.procBase, st.haveProc, st.shellBase, st.imageShell
	effects, objects, lastShell := in.kernelLocked(st)
	in.mu.Unlock()

	var same []string
	files := in.fileFacts(ctx, t, touched, timed, &same)
	facts = append(facts, files...)

	// The shell, then the processes (the shell is told apart by its pid),
	// from one scan of them after the shell's query ran.
	var shell inspector.ShellState
	shellOK := false
	if st, err := inspector.ReadShell(ctx, t); err != nil {
		facts = append(facts, inspector.Fact{Kind: inspector.ShellUnknown, Detail: err.Error()})
	} else {
		shell, shellOK = st, true
	}
	if shellOK {
		switch {
		case shellBase.Digest == "":
			facts = append(facts, inspector.Fact{Kind: inspector.ShellChanged, Detail: "no digest at the last checkpoint"})
		case shell.Digest != shellBase.Digest:
			facts = append(facts, inspector.Fact{Kind: inspector.ShellChanged})
		case !shell.Bash && inspector.MayDefineFunction(t.Command):
			facts = append(facts, inspector.Fact{Kind: inspector.ShellChanged, Detail: "the shell cannot list functions and the command may define one"})
		}
	}
	sc := in.scan(t)
	facts = append(facts, heldFacts(sc, t.LiveRoot, files, same)...)
	facts = append(facts, in.procFacts(sc, t, shell.PID, procBase, haveProc)...)
	if shellOK {
		lastShell = shell.PID
	}
	facts = append(facts, kernelFacts(sc, lastShell, effects, objects)...)
	var delta *pendingDelta
	if shellOK && inspector.OnlyShellChanged(facts) {
		if script, ok := inspector.ShellDelta(imageShell, shell); ok {
			delta = &pendingDelta{d: inspector.Delta{Script: script, Digest: shell.Digest}, shell: shell}
		}
	}

	in.mu.Lock()
	st.delta = delta
	for _, p := range same {
		delete(st.touched, p)
		delete(st.timed, p)
	}
	if shellOK {
		st.shell = shell
	} else {
		// Forget the digest of the last read, or a checkpoint of this
		// turn would record it as the state its image holds, and a later
		// turn that went back to it would compare equal and skip.
		st.shell = inspector.ShellState{PID: st.shell.PID}
	}
	in.mu.Unlock()
	return inspector.Classify(facts), nil
}

// fileFacts compares the touched paths (plus, without eBPF, the backend's
// change list) with the last filesystem artifact, reading at most
// in.maxRead bytes of content in all; same collects the paths found
// unchanged.
func (in *Inspector) fileFacts(ctx context.Context, t inspector.Target, touched []string, timed map[string]struct{}, same *[]string) []inspector.Fact {
	var facts []inspector.Fact
	if in.tr == nil {
		if t.Changes == nil {
			facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: "no eBPF and no change list"})
		} else if ch, err := t.Changes(ctx); err != nil {
			facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: fmt.Sprintf("change list: %v", err)})
		} else {
			for _, c := range ch {
				touched = append(touched, c.Path)
			}
		}
	}
	bud := inspector.NewBudget(in.maxRead)
	for _, p := range touched {
		if t.SnapshotRoot == "" {
			facts = append(facts, inspector.Fact{Kind: inspector.FileChanged, Path: p})
			continue
		}
		unproven := bud.Unproven()
		changed, err := inspector.PathChangedWithin(ctx, bud, t.LiveRoot, t.SnapshotRoot, p)
		switch {
		case err != nil:
			facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: fmt.Sprintf("compare %s: %v", p, err)})
		case bud.Unproven() > unproven:
			facts = append(facts, inspector.Fact{Kind: inspector.FileChanged, Path: p, Detail: fmt.Sprintf("content not compared, past the turn's %d-byte read cap", max(in.maxRead, 0))})
		case changed:
			facts = append(facts, inspector.Fact{Kind: inspector.FileChanged, Path: p})
		default:
			if _, ok := timed[p]; ok {
				if differ, err := inspector.DirTimesDiffer(t.LiveRoot, t.SnapshotRoot, p); err != nil || differ {
					facts = append(facts, inspector.Fact{Kind: inspector.FileChanged, Path: p, Detail: "directory times set"})
					continue
				}
			}
			*same = append(*same, p)
		}
	}
	return facts
}

// noEBPF is the effect every turn has without eBPF: what the turn's
// processes did to kernel state outside files cannot be seen.
const noEBPF = "no eBPF: IPC objects, queued data and other processes' attributes cannot be seen"

// kernelLocked copies st's effect calls and stream objects, and the shell
// pid last read; in.mu held.
func (in *Inspector) kernelLocked(st *envState) ([]string, map[objKey]Object, int) {
	effects := slices.Clone(st.effects)
	if in.tr == nil {
		effects = append(effects, noEBPF)
	}
	return effects, maps.Clone(st.objects), st.shell.PID
}

// procFacts compares the long-lived processes with the baseline.
func (in *Inspector) procFacts(sc *scan, t inspector.Target, shellPID int, base []inspector.ProcSample, haveBase bool) []inspector.Fact {
	if t.Cgroup == "" {
		return []inspector.Fact{{Kind: inspector.ProcRan, Detail: "no cgroup given"}}
	}
	now, err := sampleProcs(sc, shellPID, in.returns())
	switch {
	case err != nil:
		return []inspector.Fact{{Kind: inspector.ProcRan, Detail: err.Error()}}
	case !haveBase:
		return []inspector.Fact{{Kind: inspector.ProcRan, Detail: "no process sample at the last checkpoint"}}
	case shellPID == 0:
		return []inspector.Fact{{Kind: inspector.ProcRan, Detail: "shell pid unknown"}}
	}
	return inspector.CompareProcs(base, now, in.tr != nil)
}

// Settle re-checks, while the sandbox is frozen for the checkpoint that
// EndTurn classified k, the parts k leaves out: a background process may
// have written files or run between the end of the turn and the freeze.
// It returns the kind to take (k or more), with the reasons it grew.
// Call it after Freeze and before making the artifacts.
func (in *Inspector) Settle(ctx context.Context, envID string, k state.Kind, t inspector.Target) (state.Kind, []string, error) {
	in.mu.Lock()
	st0, ok := in.envs[envID]
	delta := ok && st0.delta != nil && k.Has(state.Proc)
	in.mu.Unlock()
	if k == state.Full && !delta {
		return k, nil, nil
	}
	if err := in.sync(ctx); err != nil {
		in.dropDelta(envID)
		return state.Full, []string{err.Error()}, err
	}
	in.mu.Lock()
	st, ok := in.envs[envID]
	if !ok {
		in.mu.Unlock()
		return state.Full, nil, fmt.Errorf("%w: %s", ErrUnknownEnv, envID)
	}
	var facts []inspector.Fact
	for _, why := range st.unaccounted {
		facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: why})
	}
	if lost := in.lostLocked(); lost > st.lostBase {
		facts = append(facts, inspector.Fact{Kind: inspector.Unaccounted, Detail: "lost events"})
	}
	touched := make([]string, 0, len(st.touched))
	for p := range st.touched {
		touched = append(touched, p)
	}
	timed := maps.Clone(st.timed)
	shellPID, base, haveBase := st.shell.PID, st.procBase, st.haveProc
	effects, objects, _ := in.kernelLocked(st)
	in.mu.Unlock()
	sc := in.scan(t)
	if !k.Has(state.FS) {
		var same []string
		files := in.fileFacts(ctx, t, touched, timed, &same)
		facts = append(append(facts, files...), heldFacts(sc, t.LiveRoot, files, same)...)
	}
	if !k.Has(state.Proc) || delta {
		// A shell delta reuses the last image for every other process:
		// none may have run since it was taken.
		facts = append(facts, in.procFacts(sc, t, shellPID, base, haveBase)...)
		facts = append(facts, kernelFacts(sc, shellPID, effects, objects)...)
	}
	r := inspector.Classify(facts)
	if delta && !inspector.OnlyShellChanged(append(facts, inspector.Fact{Kind: inspector.ShellChanged})) {
		in.dropDelta(envID)
	}
	return k.Join(r.Kind), r.Reasons, nil
}

func (in *Inspector) dropDelta(envID string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if st, ok := in.envs[envID]; ok {
		st.delta = nil
	}
}

// TakeShellDelta returns the shell delta of envID's last turn, when its
// only process change was the managed shell's own state and Settle found
// nothing else since: a checkpoint may then record it on top of the last
// process image instead of dumping the processes. Taking it makes the
// shell state it reaches the baseline of the shell; call it while the
// sandbox is frozen for that checkpoint, and then Checkpointed with the
// kind of the other artifacts written (fs or none). A checkpoint that
// fails after it must be followed by a full one or a Baseline.
func (in *Inspector) TakeShellDelta(envID string) (inspector.Delta, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	st, ok := in.envs[envID]
	if !ok || st.delta == nil {
		return inspector.Delta{}, false
	}
	d := st.delta
	st.delta = nil
	st.shellBase = d.shell
	return d.d, true
}

// scan starts one reading of t's processes (docs/inspector.md, "Cost"),
// bounded by Options.MaxScan.
func (in *Inspector) scan(t inspector.Target) *scan {
	return newScan(t.Cgroup, in.maxScan)
}

func (in *Inspector) returns() func(uint32) (uint64, bool) {
	if in.tr == nil {
		return nil
	}
	return in.tr.Returns
}

// Checkpointed tells the inspector that a checkpoint of kind k of envID
// was taken: its parts become the new baseline. Call it while the sandbox
// is still frozen after the snapshot or dump (branch.Options.OnFrozen), so
// that nothing runs between the artifact and the baseline. The shell state
// recorded is the one the last EndTurn read.
func (in *Inspector) Checkpointed(envID string, k state.Kind, t inspector.Target) error {
	var procs []inspector.ProcSample
	if k.Has(state.Proc) {
		in.mu.Lock()
		st, ok := in.envs[envID]
		var shellPID int
		if ok {
			shellPID = st.shell.PID
		}
		in.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: %s", ErrUnknownEnv, envID)
		}
		var err error
		if procs, err = sampleProcs(in.scan(t), shellPID, in.returns()); err != nil {
			// The image holds processes no sample describes: the next
			// turn must dump them again, whatever it does.
			in.mu.Lock()
			if st, ok := in.envs[envID]; ok {
				st.haveProc, st.shellBase, st.imageShell, st.delta = false, inspector.ShellState{}, inspector.ShellState{}, nil
			}
			in.mu.Unlock()
			return err
		}
	}
	now := monotonicNow()
	in.mu.Lock()
	defer in.mu.Unlock()
	st, ok := in.envs[envID]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownEnv, envID)
	}
	if k.Has(state.FS) {
		st.touched, st.timed = map[string]struct{}{}, map[string]struct{}{}
		st.since = now
	}
	if k.Has(state.Proc) {
		st.procBase, st.haveProc = procs, true
		st.shellBase, st.imageShell, st.delta = st.shell, st.shell, nil
		st.effects, st.objects, st.procSince = nil, map[objKey]Object{}, now
	}
	if k == state.Full {
		st.unaccounted = nil
		st.lostBase = in.lostLocked()
	}
	return nil
}

// Baseline makes the live state of envID its baseline, reading the shell
// state through the shell: for a sandbox just started or restored, whose
// state equals its state's artifacts. Nothing may run in it meanwhile.
// image is the shell state the process image holds when it is not the
// live one (a shell delta state's restore, which read it before running
// the delta), nil otherwise: later deltas apply on the image.
func (in *Inspector) Baseline(ctx context.Context, envID string, t inspector.Target, image *inspector.ShellState) error {
	if t.Shell == nil {
		return fmt.Errorf("baseline of %s: no shell", envID)
	}
	if err := in.sync(ctx); err != nil {
		return err
	}
	shell, err := inspector.ReadShell(ctx, t)
	if err != nil {
		return fmt.Errorf("baseline of %s: %w", envID, err)
	}
	in.mu.Lock()
	if st, ok := in.envs[envID]; ok {
		st.shell = shell
	}
	in.mu.Unlock()
	if err := in.Checkpointed(envID, state.Full, t); err != nil {
		return err
	}
	if image != nil {
		in.mu.Lock()
		if st, ok := in.envs[envID]; ok && st.haveProc {
			st.imageShell = *image
		}
		in.mu.Unlock()
	}
	return nil
}

// Stats are counters for benchmarks and metrics.
type Stats struct {
	Events uint64 // events that touched a path or forced full
	Lost   uint64 // events the ring buffer had no room for
}

// Stats returns the inspector's counters.
func (in *Inspector) Stats() Stats {
	in.mu.Lock()
	defer in.mu.Unlock()
	return Stats{Events: in.events, Lost: in.lostLocked()}
}
