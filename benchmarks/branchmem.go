package benchmarks

// The variants of the branch-by-memory measurement (BranchMem.MS).
const (
	// BranchSmall is the service trace's state (a Python server, bash,
	// ~10 MiB of process image: restored eagerly).
	BranchSmall = "small"
	// BranchBigEager and BranchBigLazy are a state whose Python process
	// holds BigMB MiB of touched memory, restored eagerly and lazily
	// (docs/engine.md, "Lazy restore").
	BranchBigEager = "big-eager"
	BranchBigLazy  = "big-lazy"
)

// bigMaxN bounds the fan-out of the big sandbox's branches: every child
// ends up holding BigMB of its own (CRIU copies the pages, lazily or not),
// and 32 of them would take 9 GiB of a shared VM.
const bigMaxN = 8

// branchPhaseLazyStart is branch.PhaseLazyStart (this file builds
// without the engine).
const branchPhaseLazyStart = "criu: lazy-pages start"

// branchVariants in report order.
var branchVariants = []string{BranchSmall, BranchBigEager, BranchBigLazy}

// BranchMem is branch(n) from past states (not an env's head, so no warm
// copy) by the memory the source holds, and what each child is charged.
type BranchMem struct {
	BigMB int `json:"big_mb"`
	// MS: variant -> n -> latencies (ms) of branch(n).
	MS map[string]map[int][]float64 `json:"branch_ms"`
	// MemN is the fan-out whose children's memory is read; Memory:
	// variant -> the mean per child.
	MemN   int                    `json:"memory_n"`
	Memory map[string]ChildMemory `json:"memory"`
	// ImageBytes: variant -> the size of the source state's process
	// image as CRIU dumped it (what a restore brings back); ImageStored:
	// as stored (less when it is a delta image, docs/engine.md "Delta
	// images").
	ImageBytes  map[string]int64 `json:"image_bytes"`
	ImageStored map[string]int64 `json:"image_stored,omitempty"`
	// Phases: variant -> restore phase (branch.Phase*) -> ms per child
	// of the restores of branch(MemN) (each restore's own time: the
	// queue runs one per core at once).
	Phases map[string]map[string]float64 `json:"phases_ms_per_child"`
	// SmallPhases are the small state's, of branch(SmallPhasesN), the
	// largest fan-out timed.
	SmallPhases  map[string]float64 `json:"small_phases_ms_per_child"`
	SmallPhasesN int                `json:"small_phases_n"`
	// PhaseNames orders the phases (branch.RestorePhaseNames).
	PhaseNames []string `json:"phase_names"`
}

// ChildMemory is what a branch child's memory cgroup is charged (MiB),
// right after branch(n) returned and 10 s later: all of it
// (memory.current) and the anonymous part (the processes' private
// memory).
type ChildMemory struct {
	AfterMiB     float64 `json:"after_mib"`
	AnonAfterMiB float64 `json:"anon_after_mib"`
	After10sMiB  float64 `json:"after_10s_mib"`
	Anon10sMiB   float64 `json:"anon_after_10s_mib"`
	// LazyRestores counts the children restored lazily.
	LazyRestores int64 `json:"lazy_restores"`
}
