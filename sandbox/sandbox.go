package sandbox

import (
	"fmt"
	"log/slog"
	"time"
)

// Limits bound what a sandbox may use.
type Limits struct {
	// MemoryBytes caps memory (the OOM killer acts inside the sandbox).
	MemoryBytes int64
	// Pids caps the number of tasks (threads count), which stops fork bombs.
	Pids int64
	// CPUs caps CPU time, in cores.
	CPUs float64
}

// DefaultLimits are used for zero fields of Config.Limits.
var DefaultLimits = Limits{MemoryBytes: 1 << 30, Pids: 512, CPUs: 1}

func (l Limits) withDefaults() Limits {
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = DefaultLimits.MemoryBytes
	}
	if l.Pids <= 0 {
		l.Pids = DefaultLimits.Pids
	}
	if l.CPUs <= 0 {
		l.CPUs = DefaultLimits.CPUs
	}
	return l
}

// Config describes a sandbox to start.
type Config struct {
	// ID names the sandbox (cgroup name, logs). Letters, digits, - and _.
	ID string
	// Root is the host path of the sandbox's writable root file system.
	Root string
	// InitBinary is the host path of a static arbor-init; see FindInit.
	InitBinary string
	// Hostname inside the sandbox; default "arbor".
	Hostname string
	Limits   Limits
	Logger   *slog.Logger
	// UserNS runs the sandbox in its own user namespace (userns.go).
	UserNS UserNSConfig
}

// ExecOptions tune one command.
type ExecOptions struct {
	// Timeout bounds the command (default 60 s); on expiry its process
	// group is killed and the shell stays.
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr (default 256 KiB); the head
	// and the tail are kept.
	MaxOutput int
}

// Result is what one command did.
type Result struct {
	Stdout, Stderr []byte
	// StdoutBytes and StderrBytes are the sizes before capping.
	StdoutBytes, StderrBytes int64
	Truncated                bool
	ExitCode                 int
	// Cwd is the shell's working directory after the command.
	Cwd      string
	TimedOut bool
	Duration time.Duration
	// ShellRestarted: the command ended the shell (e.g. `exit`) or had to
	// be killed with it; a fresh shell with empty state took its place.
	ShellRestarted bool
	// Limits lists the resource limits the sandbox hit since the previous
	// command, and what was done about it.
	Limits []LimitEvent
}

// LimitEvent reports that a sandbox hit a resource limit.
type LimitEvent struct {
	Resource string // "pids" or "memory"
	Limit    int64
	Message  string
}

func (e LimitEvent) String() string {
	return fmt.Sprintf("%s limit %d: %s", e.Resource, e.Limit, e.Message)
}
