// Package doctor checks that a host has what Arbor needs (root, CRIU 4.x,
// btrfs, ZFS tools, eBPF with tracepoints, cgroups, sandbox isolation,
// user namespaces, soft-dirty tracking, free space) and says how to fix what is missing. The checks are plain
// functions over a Host, so tests can run them against fakes; host_linux.go
// has the real probes.
package doctor

import (
	"context"
	"io/fs"
	"time"

	"github.com/arbor-env/arbor/sandbox"
)

// Status is the outcome of one check.
type Status string

// Outcomes: a required check that is not OK fails; an optional one warns.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Check is one line of the report.
type Check struct {
	Name     string `json:"name"`
	Status   Status `json:"status"`
	Required bool   `json:"required"`
	Detail   string `json:"detail"`
	Remedy   string `json:"remedy,omitempty"`
}

// Report is the result of Run.
type Report struct {
	OK     bool    `json:"ok"` // false when a required check failed
	Checks []Check `json:"checks"`
}

// Options are the settings the checks depend on.
type Options struct {
	CRIUFlag string // --criu; empty means criubin's default order
	StateDir string // --state-dir
	// Backend is --backend: "zfs" makes the zfs check required and the
	// btrfs check optional.
	Backend string
	// ZFSDataset is ARBOR_ZFS_DATASET (empty: arbor serve's own pool).
	ZFSDataset string
	// MinFreeBytes is the free space below which the state dir warns.
	MinFreeBytes uint64
}

// DefaultMinFree is the free-space warning threshold: a pool file, a
// Debian image and a few dozen checkpoints fit in it.
const DefaultMinFree = 5 << 30

// Host is what the checks observe. host_linux.go implements it for real.
type Host interface {
	Euid() int
	ReadFile(name string) ([]byte, error)
	Stat(name string) (fs.FileInfo, error)
	LookPath(file string) (string, error)
	// Run runs a command and returns its combined output.
	Run(ctx context.Context, env []string, name string, args ...string) ([]byte, error)
	// CRIUDump dumps a throwaway sleeping process with criu and reports
	// how long it took; env is added to criu's environment.
	CRIUDump(ctx context.Context, criu string, env []string) (time.Duration, error)
	// MountTracefs mounts tracefs at TracefsDir.
	MountTracefs() error
	// BPFTracepoint loads a trivial program and attaches it to
	// tracepoint group/name.
	BPFTracepoint(group, name string) error
	// CgroupChildHas makes a child cgroup under dir, reports whether the
	// child has file, and removes the child.
	CgroupChildHas(dir, file string) (bool, error)
	// SoftDirty reports whether a page written after clearing soft-dirty
	// bits shows bit 55 in /proc/self/pagemap.
	SoftDirty() (bool, error)
	// FreeBytes is the space available on the file system holding path.
	FreeBytes(path string) (uint64, error)
	// ProcessRunning reports whether a process with this comm exists.
	ProcessRunning(comm string) bool
	// SeccompFilter compiles the default sandbox seccomp filter and
	// reports libseccomp's version and the program's length.
	SeccompFilter() (libseccomp string, instructions int, err error)
}

// Run runs every check in a fixed order.
func Run(ctx context.Context, h Host, o Options) Report {
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = DefaultMinFree
	}
	var checks []Check
	checks = append(checks, CheckRoot(h))
	_, cs := CheckCRIU(ctx, h, o.CRIUFlag)
	checks = append(checks, cs...)
	checks = append(checks, CheckBtrfs(h, o), CheckZFS(ctx, h, o))
	tracefs := CheckTracefs(h)
	checks = append(checks, tracefs, CheckBPF(h, tracefs.Status == OK))
	mountinfo, _ := h.ReadFile("/proc/self/mountinfo")
	checks = append(checks, CheckCgroupV2(h, string(mountinfo)), CheckCgroupControllers(h, string(mountinfo)))
	checks = append(checks, CheckIsolation(h, string(mountinfo)))
	checks = append(checks, CheckSoftDirty(h), CheckFreeSpace(h, o.StateDir, o.MinFreeBytes))
	checks = append(checks, CheckUserNS(ctx, h, sandbox.DefaultUserNSHostID, sandbox.DefaultUserNSSize)) // userns.go
	r := Report{OK: true, Checks: checks}
	for _, c := range checks {
		if c.Status == Fail {
			r.OK = false
		}
	}
	return r
}
