package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// Limits bound what a sandbox may use.
type Limits struct {
	// MemoryBytes caps memory (the OOM killer acts inside the sandbox).
	MemoryBytes int64
	// Pids caps the number of tasks (threads count), which stops fork bombs.
	Pids int64
	// CPUs caps CPU time, in cores.
	CPUs float64
	// DiskBytes caps what the sandbox may write to its root: the data it
	// wrote since its root was cloned that still exists, in the root or in
	// the checkpoints taken of it (cr.Quotaer). Writes past it fail with
	// EDQUOT, "Disk quota exceeded". Negative: no quota. The sandbox
	// package only reports the quota (Config.Disk); whoever makes the
	// root sets it (sandbox/launch.SetDiskQuota).
	DiskBytes int64
}

// DefaultLimits are used for zero fields of Config.Limits.
// Memory is what a sandbox's memory cgroup charges (Sandbox.Memory).
type Memory struct {
	// Current is the whole charge: memory.current (cgroup v2), or
	// memory.usage_in_bytes of the v1 memory controller.
	Current int64
	// Anon is its anonymous part, the processes' private memory
	// (memory.stat's anon, v1's rss).
	Anon int64
}

var DefaultLimits = Limits{MemoryBytes: 1 << 30, Pids: 512, CPUs: 1, DiskBytes: 2 << 30}

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
	if l.DiskBytes == 0 {
		l.DiskBytes = DefaultLimits.DiskBytes
	}
	return l
}

// DiskQuota is the disk quota in bytes these limits give a sandbox root
// (DefaultLimits.DiskBytes when DiskBytes is 0), or 0 for none.
func (l Limits) DiskQuota() int64 {
	if l = l.withDefaults(); l.DiskBytes < 0 {
		return 0
	}
	return l.DiskBytes
}

// DiskMeter says how many more bytes a sandbox's root can take before its
// quota refuses writes; the launcher and the engine pass one bound to the
// root's volume (cr.Quotaer.Quota). It is read after every command, so it
// must be cheap.
type DiskMeter func(ctx context.Context) (free int64, err error)

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
	// Isolation is the sandbox's in-kernel hardening; the zero value is
	// the hardened default (docs/sandbox.md, "Isolation").
	Isolation Isolation
	// Disk reports the root's room under Limits.DiskBytes, for the "disk"
	// LimitEvent; nil when the root has no quota.
	Disk   DiskMeter
	Logger *slog.Logger
	// UserNS runs the sandbox in its own user namespace (userns.go).
	UserNS UserNSConfig
	// Shell is how the persistent shell starts (Start only: a restored
	// sandbox keeps the config of the sandbox that was dumped).
	Shell ShellConfig
}

// ShellConfig is how the persistent shell starts (an OCI image's config:
// docs/images.md). The zero value is today's shell: root, /root, the
// default environment. It applies to the agent's shell, and so to every
// command of a step; Sandbox.Run (the verifier) runs as root with its own
// environment whatever it says (docs/sandbox.md, "The shell's user,
// environment and directory").
type ShellConfig struct {
	// Env are KEY=VALUE pairs added to the shell's default environment; a
	// key given here replaces the default's (PATH, HOME, ...). HOME stays
	// /root unless Env sets it, whatever UID is.
	Env []string
	// Dir is the in-sandbox absolute directory the shell starts in ("":
	// /root, or / when missing). A Dir that does not exist when the
	// sandbox starts is created (owned by UID:GID, mode 0755), as Docker
	// does for WORKDIR; a shell that replaces a dead one starts in / when
	// Dir is gone by then (init does not create it again: see the doc).
	Dir string
	// UID, GID and Groups are the credentials the shell (and so every
	// command of a step) runs with; 0/0/none is root. A shell whose UID is
	// not 0 holds no capabilities (as Docker's non-root USER). Setting
	// them needs CAP_SETUID and CAP_SETGID in the sandbox's Isolation.
	UID, GID uint32
	Groups   []uint32
}

// wire is c as init gets it.
func (c ShellConfig) wire() ctl.Shell {
	return ctl.Shell{Env: c.Env, Dir: c.Dir, UID: c.UID, GID: c.GID, Groups: c.Groups}
}

// Validate reports what is wrong with c (ErrBadConfig, naming the field):
// Dir must be absolute and clean, each Env entry KEY=VALUE with a
// non-empty KEY and no NUL, and no id (uid_t)-1.
func (c ShellConfig) Validate() error {
	if err := c.wire().Validate(); err != nil {
		return fmt.Errorf("%w: Shell.%w", ErrBadConfig, err)
	}
	return nil
}

// check is Validate plus what the sandbox it starts in asks of c: ids
// inside the user namespace's range, and CAP_SETUID and CAP_SETGID kept
// when the shell is not root's.
func (c ShellConfig) check(u UserNSConfig, kept CapSet) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if u = u.WithDefaults(); u.Enabled {
		ids := append([]uint32{c.UID, c.GID}, c.Groups...)
		for _, id := range ids {
			if id >= u.Size {
				return fmt.Errorf("%w: Shell: id %d is outside the user namespace's %d ids", ErrBadConfig, id, u.Size)
			}
		}
	}
	if w := c.wire(); !w.Root() {
		need, _ := ParseCaps([]string{"CAP_SETUID", "CAP_SETGID"})
		if !need.SubsetOf(kept) {
			return fmt.Errorf("%w: Shell: UID, GID and Groups need CAP_SETUID and CAP_SETGID, which the sandbox does not keep (Isolation.Caps)", ErrBadConfig)
		}
	}
	return nil
}

// MaxOutputCeiling is the most of each of stdout and stderr a command's
// Result keeps, whatever ExecOptions.MaxOutput or RunOptions.MaxOutput
// ask: a larger MaxOutput is clamped to it (the head and the tail are kept
// and Truncated is set, as under any cap). Init keeps no output (it
// streams it to the server, docs/sandbox.md "Commands"), so this bounds
// the server's memory per command, not the sandbox's.
const MaxOutputCeiling = 64 << 20

// OutputCap is the cap of each stream for a MaxOutput option.
func OutputCap(max int) int {
	if max <= 0 {
		return ctl.DefaultMaxOutput
	}
	return min(max, MaxOutputCeiling)
}

// ExecOptions tune one command.
type ExecOptions struct {
	// Timeout bounds the command (default 60 s); on expiry its process
	// group is killed and the shell stays.
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr (default 256 KiB, at most
	// MaxOutputCeiling); the head and the tail are kept.
	MaxOutput int
	// NoLimitCheck leaves out the limit and disk checks around the command
	// (four cgroup reads and a quota read): for the harness's own queries
	// that run right after a command (the Inspector's shell query), whose
	// Result no one shows. A limit hit meanwhile is reported with the next
	// command that checks, instead of in that Result (docs/inspector.md,
	// "Cost").
	NoLimitCheck bool
}

// RunOptions tune Sandbox.Run.
type RunOptions struct {
	// Env is the script's whole environment ("KEY=VALUE"); PATH and HOME
	// are added when absent.
	Env []string
	// Dir is the working directory ("/" when empty; "/" with a note on
	// stderr when it does not exist).
	Dir string
	// Timeout bounds the script (default 60 s); on expiry its process
	// group is killed and ExitCode is 124.
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr (default 256 KiB, at most
	// MaxOutputCeiling).
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
	// RejectedStatus counts what init dropped from the status channel
	// while the command ran: writes by processes other than the shell and
	// records without the command's nonce. Non-zero means something in the
	// sandbox tried to forge a result (it did not count).
	RejectedStatus int
}

// LimitEvent reports that a sandbox hit a resource limit.
type LimitEvent struct {
	Resource string // "pids", "memory" or "disk"
	Limit    int64
	Message  string
}

func (e LimitEvent) String() string {
	return fmt.Sprintf("%s limit %d: %s", e.Resource, e.Limit, e.Message)
}
