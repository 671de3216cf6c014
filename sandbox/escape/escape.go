// Package escape is Arbor's escape suite: the known routes out of a
// sandbox that a hostile agent, running as root inside it, might try. Each
// route is attempted by the probe program (escape/probe), run inside a
// real sandbox; the suite passes when every route is blocked, in a started
// sandbox and in every restored child. docs/security.md lists the routes
// with what stops each.
//
// Every attempt is harmless to the host: a write to a host-wide file only
// writes back the value already there (it fails when the sandbox holds; if
// it succeeded it changed nothing), /proc/sysrq-trigger is only checked
// for writability with access(2), kernel calls are made with arguments the
// kernel rejects after its permission checks, and no traffic leaves the
// sandbox's own network namespace.
package escape

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
)

// Verdict is what an attempt found.
type Verdict string

// Verdicts of one attempt.
const (
	// Blocked: the route is closed.
	Blocked Verdict = "blocked"
	// Open: the route worked (the sandbox leaks).
	Open Verdict = "open"
)

// Route is one way out that the probe attempts.
type Route struct {
	// Name is the probe's name for it.
	Name string
	// Attempt says what the probe does.
	Attempt string
	// StoppedBy says what closes it in a hardened sandbox.
	StoppedBy string
	// OpenUnhardened is set for routes the probe finds open in a sandbox
	// started without hardening: there the suite expects them open, which
	// shows that the probe would notice a hole.
	OpenUnhardened bool
	// HostFile, when set, is a file the route needs on the host: where the
	// kernel lacks it (no sysrq, no kcore) the route is closed either way.
	HostFile string
}

// Routes is the suite, in the order the probe attempts them.
var Routes = []Route{
	{"core-pattern", "write /proc/sys/kernel/core_pattern back with its own value (a pipe handler there runs as host root)", "/proc/sys read-only bind mount", true, ""},
	{"host-sysctls", "write kernel/modprobe, kernel/panic, vm/overcommit_memory and fs/suid_dumpable back with their own values", "/proc/sys read-only bind mount", true, ""},
	{"sysrq-trigger", "access(W_OK) on /proc/sysrq-trigger (never written)", "read-only bind mount", true, "/proc/sysrq-trigger"},
	{"proc-kcore", "read a byte of /proc/kcore", "masked with /dev/null", true, "/proc/kcore"},
	{"proc-masked", "read /proc/keys, /proc/timer_list, /proc/sched_debug, /proc/latency_stats", "masked with /dev/null", true, ""},
	{"kallsyms", "read kernel addresses from /proc/kallsyms", "no CAP_SYSLOG: the kernel prints zeros", true, ""},
	{"kernel-log", "read the kernel log with syslog(2)", "seccomp, no CAP_SYSLOG", true, ""},
	{"mount-proc", "mount a new proc", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-sysfs", "mount sysfs", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-cgroup-v1", "mount the v1 memory hierarchy (the release_agent route)", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-cgroup2", "mount cgroup2", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-tmpfs-proc", "mount a tmpfs over /proc", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-debugfs", "mount debugfs", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-tracefs", "mount tracefs", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"mount-bpffs", "mount bpffs", "no CAP_SYS_ADMIN, seccomp", true, ""},
	{"block-device", "mknod the host's root block device and read its first sector", "devices cgroup allow-list (this host refuses the open to the unhardened control too)", false, ""},
	{"char-device", "mknod /dev/kmsg (1:11) and read it", "devices cgroup allow-list", true, ""},
	{"devices", "list device nodes in /dev", "only null, zero, full, random, urandom, tty, ptmx and the sandbox's own pts are made", false, ""},
	{"open-by-handle", "open_by_handle_at on a handle of the root file system (the 'shocker' route)", "no CAP_DAC_READ_SEARCH, seccomp", true, ""},
	{"ptrace-init", "open /proc/1/mem and every /proc/1/fd/N of the sandbox's init (forge status records, read its pipes)", "init is not dumpable and the sandbox has no CAP_SYS_PTRACE", true, ""},
	{"ptrace-host", "ptrace attach to a host process (the test's own pid)", "pid namespace: no host process is visible", false, ""},
	{"signal-host", "kill(0) a host process", "pid namespace", false, ""},
	{"bpf", "bpf(BPF_PROG_LOAD) with no program", "seccomp, no CAP_BPF/CAP_SYS_ADMIN", true, ""},
	{"perf-event-open", "perf_event_open with no attributes", "seccomp, no CAP_PERFMON", true, ""},
	{"keyctl", "keyctl(KEYCTL_GET_KEYRING_ID) on the session keyring", "seccomp", true, ""},
	{"kernel-module", "init_module and finit_module with no module", "seccomp, no CAP_SYS_MODULE (kernels without module support answer ENOSYS either way)", false, ""},
	{"reboot", "reboot(2) with an invalid magic number", "seccomp, no CAP_SYS_BOOT", true, ""},
	{"clock", "settimeofday(NULL, NULL) (changes nothing when allowed)", "seccomp, no CAP_SYS_TIME", true, ""},
	{"swapon", "swapon of a file that does not exist", "seccomp, no CAP_SYS_ADMIN", true, ""},
	{"userns-mount", "clone into a new user and mount namespace, then mount a tmpfs", "seccomp denies namespace flags without CAP_SYS_ADMIN", true, ""},
	{"init-exe", "open /proc/1/exe and /.arbor/init for writing", "init's executable is busy and /proc/1 is not accessible", false, ""},
	{"chroot-breakout", "chroot into a subdirectory, climb out with .. and chroot(.) (the classic breakout)", "pivot_root into a private mount namespace: the top is the sandbox root", false, ""},
	{"host-paths", "look for Arbor's state directory and another sandbox's files", "private mount namespace rooted at the sandbox's clone", false, ""},
	{"btrfs-subvolume", "create a btrfs subvolume or snapshot inside the root (the disk quota would not cover it)", "seccomp denies the btrfs subvolume and snapshot ioctls", true, ""},
	{"network", "list network interfaces", "own network namespace with loopback only", false, ""},
}

// Result is one line of the probe's output.
type Result struct {
	Route   string  `json:"route"`
	Verdict Verdict `json:"verdict"`
	Detail  string  `json:"detail"`
}

// Parse reads the probe's output: one JSON Result per line.
func Parse(out []byte) ([]Result, error) {
	var rs []Result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var r Result
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("parse probe line %q: %w", line, err)
		}
		if r.Verdict != Blocked && r.Verdict != Open {
			return nil, fmt.Errorf("probe line %q: verdict %q", line, r.Verdict)
		}
		rs = append(rs, r)
	}
	return rs, sc.Err()
}
