package state

// Kind is a turn's net change, and what its checkpoint captured: nothing,
// the files, the processes, or both (docs/engine.md, "Checkpoint kinds").
type Kind string

// The kinds, from no change to everything.
const (
	None Kind = "none" // no net change
	FS   Kind = "fs"   // files changed, persistent processes did not
	Proc Kind = "proc" // process state changed, files did not
	Full Kind = "full" // both
)

// Valid reports whether k is one of the four kinds.
func (k Kind) Valid() bool { return k == None || k == FS || k == Proc || k == Full }

// Has reports whether k includes the part o (FS or Proc).
func (k Kind) Has(o Kind) bool { return k == o || k == Full }

// Join combines two kinds: what a checkpoint must capture for both.
func (k Kind) Join(o Kind) Kind {
	switch {
	case k == o || o == None:
		return k
	case k == None:
		return o
	default:
		return Full
	}
}

// The tools an action names (docs/protocol.md, "step").
const (
	ToolBash      = "bash"
	ToolWriteFile = "write_file"
	ToolReadFile  = "read_file"
	ToolRollback  = "rollback"
)
