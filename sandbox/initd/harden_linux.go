package initd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"github.com/moby/sys/capability"
	"golang.org/x/sys/unix"
)

// Hardening is what stage one applies to init, and so to everything it
// starts, just before it execs stage two (docs/sandbox.md, "Isolation").
type Hardening struct {
	// Caps is the capability set kept (bit n is capability n) in the
	// bounding, permitted, effective and inheritable sets.
	Caps uint64
	// Seccomp is the classic-BPF program (struct sock_filter array) the
	// server compiled; it is loaded last.
	Seccomp []byte
}

// maskedPaths are Docker's and runc's: files get /dev/null bound over
// them, directories an empty read-only tmpfs. Paths missing on this kernel
// are skipped. /sys is not mounted in a sandbox; its entries are listed
// for when it is.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

// readonlyPaths are bind-mounted onto themselves read-only (Docker's list).
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// readSeccomp reads the program the server handed over on fd and closes fd.
func readSeccomp(fd int) ([]byte, error) {
	f := os.NewFile(uintptr(fd), "seccomp")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("read seccomp program: %w", err)
	}
	if len(b) == 0 || len(b)%int(unsafe.Sizeof(unix.SockFilter{})) != 0 {
		return nil, fmt.Errorf("read seccomp program: %d bytes is not a BPF program", len(b))
	}
	return b, nil
}

// maskProc hides the /proc (and /sys) entries that leak host information
// or reach host-wide settings; it runs after the pivot, so paths are the
// sandbox's own. CRIU dumps and restores these mounts with the tree (a
// bind of the root's /dev/null, one tmpfs, read-only binds of proc).
func maskProc() error {
	var sharedDir string // the first masked directory's tmpfs, bound over the others
	for _, p := range maskedPaths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("stat %s: %w", p, err)
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if isDir {
			// An empty proc directory hides nothing and nothing can be
			// created in it; masking it would cost a tmpfs that CRIU
			// archives at every dump (~6 ms here: /proc/acpi of a VM).
			if ents, err := os.ReadDir(p); err == nil && len(ents) == 0 {
				continue
			}
		}
		var err error
		switch {
		case !isDir:
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		case sharedDir != "":
			err = unix.Mount(sharedDir, p, "", unix.MS_BIND, "")
		default:
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555")
			sharedDir = p
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonlyPaths {
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("bind %s: %w", p, err)
		}
		var sfs unix.Statfs_t
		if err := unix.Statfs(p, &sfs); err != nil {
			return fmt.Errorf("statfs %s: %w", p, err)
		}
		flags := uintptr(sfs.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount(p, p, "", flags|unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// harden drops the privileges of the calling thread, the one that execs
// stage two next (capabilities, no_new_privs and seccomp are per thread,
// and execve keeps only the caller): the bounding set first (dropping
// needs CAP_SETPCAP), no_new_privs, the other sets, ambient cleared, then
// the seccomp filter, after which only the exec itself runs.
func harden(h Hardening) error {
	caps, err := capability.NewPid2(0)
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	caps.Clear(capability.CAPS | capability.BOUNDS | capability.AMBS)
	for _, c := range capability.ListKnown() {
		if h.Caps&(1<<uint(c)) != 0 {
			caps.Set(capability.CAPS|capability.BOUNDS, c)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := caps.Apply(capability.CAPS | capability.BOUNDS | capability.AMBS); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	return loadSeccomp(h.Seccomp)
}

// loadSeccomp installs prog as the thread's seccomp filter.
func loadSeccomp(prog []byte) error {
	n := len(prog) / int(unsafe.Sizeof(unix.SockFilter{}))
	filters := make([]unix.SockFilter, n)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&filters[0])), len(prog)), prog)
	fprog := unix.SockFprog{Len: uint16(n), Filter: &filters[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("load seccomp filter: %w", e)
	}
	return nil
}
