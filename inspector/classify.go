package inspector

import (
	"fmt"
	"slices"

	"github.com/arbor-env/arbor/state"
)

// FactKind says what a Fact observed.
type FactKind int

// Facts and the part of the state each one changes.
const (
	// FileChanged: a path differs from the last filesystem artifact.
	FileChanged FactKind = iota + 1
	// ProcStarted, ProcExited, ProcRan: a long-lived process is new, gone,
	// or ran (its memory may have changed) since the last process artifact.
	ProcStarted
	ProcExited
	ProcRan
	// ShellChanged: the managed shell's state digest differs.
	ShellChanged
	// ShellUnknown: the shell's state could not be read.
	ShellUnknown
	// Unaccounted: a change the inspector cannot see into (lost events,
	// io_uring, shared writable file mappings, mounts, unresolvable or
	// truncated paths): everything must be taken.
	Unaccounted
	// KernelChanged: a turn changed kernel state that lives outside every
	// file and outside the memory of the processes sampled, and that a
	// process dump records: an IPC object, data queued in (or taken from)
	// a pipe, FIFO or socket that a process outliving the turn holds,
	// another process's scheduling, affinity or I/O priority, a signal to
	// another process, a memory file rewritten through /proc/PID/fd.
	KernelChanged
)

// Fact is one observation about a turn.
type Fact struct {
	Kind   FactKind
	Path   string // FileChanged
	PID    int    // Proc* (host pid)
	Detail string
}

// Result is a turn's net change.
type Result struct {
	Kind state.Kind
	// Paths that differ from the last filesystem artifact, sorted.
	Paths []string
	// Reasons says why, one line per fact ("file /work/a changed").
	Reasons []string
}

// MaxReasons bounds Result.Reasons; the rest is summarised.
const MaxReasons = 32

// Classify applies the net-change rules to the facts of one turn:
// changed files make it fs, process, shell or kernel changes proc,
// anything unaccounted full.
func Classify(facts []Fact) Result {
	r := Result{Kind: state.None}
	more := 0
	for _, f := range facts {
		var k state.Kind
		var why string
		switch f.Kind {
		case FileChanged:
			k, why = state.FS, fmt.Sprintf("file %s changed", f.Path)
			r.Paths = append(r.Paths, f.Path)
		case ProcStarted:
			k, why = state.Proc, fmt.Sprintf("process %d started", f.PID)
		case ProcExited:
			k, why = state.Proc, fmt.Sprintf("process %d exited", f.PID)
		case ProcRan:
			k, why = state.Proc, fmt.Sprintf("process %d ran", f.PID)
		case ShellChanged:
			k, why = state.Proc, "shell state changed"
		case ShellUnknown:
			k, why = state.Proc, "shell state unknown"
		case Unaccounted:
			k, why = state.Full, "unaccounted"
		case KernelChanged:
			k, why = state.Proc, "kernel state changed"
		default:
			k, why = state.Full, fmt.Sprintf("unknown fact %d", f.Kind)
		}
		if f.Detail != "" {
			why += ": " + f.Detail
		}
		if f.Kind == Unaccounted {
			why = f.Detail + " -> full"
		}
		r.Kind = r.Kind.Join(k)
		if len(r.Reasons) < MaxReasons {
			r.Reasons = append(r.Reasons, why)
		} else {
			more++
		}
	}
	if more > 0 {
		r.Reasons = append(r.Reasons, fmt.Sprintf("and %d more", more))
	}
	slices.Sort(r.Paths)
	r.Paths = slices.Compact(r.Paths)
	return r
}
