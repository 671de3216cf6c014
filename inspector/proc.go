package inspector

import (
	"fmt"
	"slices"
	"time"
)

// ProcKey identifies a process across pid reuse.
type ProcKey struct {
	PID   int    // host pid
	Start uint64 // start time in clock ticks since boot
}

// ProcSample is what the inspector records of one long-lived process.
type ProcSample struct {
	ProcKey
	Comm    string
	Threads int
	// Runtime is the CPU time of all its threads (schedstat), in ns.
	Runtime time.Duration
	// Returns counts its syscalls that returned to user mode (eBPF); valid
	// when HasReturns.
	Returns    uint64
	HasReturns bool
	// Running: a thread was running or stopped in user mode when sampled,
	// so it will run again without a syscall returning.
	Running bool
	Zombie  bool
	// Stopped: stopped by a signal (SIGSTOP, SIGTSTP: state T), and
	// Pending: its pending signals (the process's and each thread's).
	// Both change without the process running (a signal from another
	// process), and a restore brings them back.
	Stopped bool
	Pending string
	// Attrs is ProcAttrs: limits, nice and oom_score_adj, which another
	// process changes without this one running (prlimit, renice).
	Attrs string
	// SharedWritable lists shared writable file mappings: writes through
	// them reach files without any syscall.
	SharedWritable []string
}

// cpuSlack is the CPU time a process may use without having run user code:
// a freeze and thaw by a checkpoint wakes it in the kernel for a moment.
const cpuSlack = time.Millisecond

// CompareProcs compares the long-lived processes now with the sample taken
// at the last process artifact. precise says the samples carry eBPF return
// counts; without them any CPU time at all counts as having run.
func CompareProcs(base, now []ProcSample, precise bool) []Fact {
	was := make(map[ProcKey]ProcSample, len(base))
	for _, p := range base {
		was[p.ProcKey] = p
	}
	var facts []Fact
	seen := make(map[ProcKey]bool, len(now))
	for _, p := range now {
		seen[p.ProcKey] = true
		b, ok := was[p.ProcKey]
		if !ok {
			facts = append(facts, Fact{Kind: ProcStarted, PID: p.PID, Detail: p.Comm})
			for _, m := range p.SharedWritable {
				facts = append(facts, Fact{Kind: Unaccounted, Detail: fmt.Sprintf("shared writable mapping of %s by process %d", m, p.PID)})
			}
			continue
		}
		var why string
		switch {
		case p.Zombie != b.Zombie:
			facts = append(facts, Fact{Kind: ProcExited, PID: p.PID, Detail: p.Comm})
			continue
		case b.Running:
			why = "was running at the checkpoint"
		case p.Stopped != b.Stopped:
			why = fmt.Sprintf("stopped %v -> %v", b.Stopped, p.Stopped)
		case p.Pending != b.Pending:
			why = fmt.Sprintf("pending signals %s -> %s", b.Pending, p.Pending)
		case p.Attrs != b.Attrs:
			why = "limits, nice or oom_score_adj changed"
		case p.Threads != b.Threads:
			why = fmt.Sprintf("threads %d -> %d", b.Threads, p.Threads)
		case precise && (p.HasReturns != b.HasReturns || p.Returns != b.Returns):
			why = fmt.Sprintf("%d syscalls returned", p.Returns-b.Returns)
		case precise && p.Runtime-b.Runtime > cpuSlack:
			why = fmt.Sprintf("used %v of CPU", p.Runtime-b.Runtime)
		case !precise && p.Runtime != b.Runtime:
			why = fmt.Sprintf("used %v of CPU", p.Runtime-b.Runtime)
		}
		if why == "" {
			continue
		}
		facts = append(facts, Fact{Kind: ProcRan, PID: p.PID, Detail: p.Comm + ": " + why})
		for _, m := range p.SharedWritable {
			facts = append(facts, Fact{Kind: Unaccounted, Detail: fmt.Sprintf("shared writable mapping of %s by process %d", m, p.PID)})
		}
	}
	gone := make([]ProcSample, 0)
	for _, p := range base {
		if !seen[p.ProcKey] {
			gone = append(gone, p)
		}
	}
	slices.SortFunc(gone, func(a, b ProcSample) int { return a.PID - b.PID })
	for _, p := range gone {
		facts = append(facts, Fact{Kind: ProcExited, PID: p.PID, Detail: p.Comm})
	}
	return facts
}
