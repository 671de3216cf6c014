package inspector

import (
	"context"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/sandbox"
)

// Shell runs a command in an environment's managed shell; *sandbox.Sandbox
// is one.
type Shell interface {
	Exec(ctx context.Context, cmd string, o sandbox.ExecOptions) (*sandbox.Result, error)
}

// Target tells the inspector where an environment's state lives at the
// moment of a call.
type Target struct {
	// Shell runs ShellQuery; nil means the shell state is unknown.
	Shell Shell
	// Cgroup is the sandbox's v2 cgroup directory (Sandbox.FreezerCgroup).
	Cgroup string
	// LiveRoot is the host path of the sandbox's root.
	LiveRoot string
	// SnapshotRoot is the host path of the root of the last filesystem
	// artifact; empty when there is none (then every touched path counts).
	SnapshotRoot string
	// Changes lists the paths that differ between the last filesystem
	// artifact and the live root (cr.Snapshotter.Changes); used without
	// eBPF, where it is required.
	Changes func(ctx context.Context) ([]cr.Change, error)
	// Command is the turn's command text, if known: a shell that cannot
	// list its functions is assumed changed when it may define one.
	Command string
}
