//go:build linux

// Command probe attempts every route of the escape suite (package escape)
// from inside a sandbox and prints one JSON line per route: blocked or
// open, with what it saw. It exits 0 when it could attempt every route
// (whatever the verdicts), 2 on a usage error.
//
// Environment (set by the test that runs it):
//
//	ESCAPE_HOST_DEV    major:minor of the host's root block device
//	ESCAPE_HOST_PID    a pid on the host (the test's own)
//	ESCAPE_HOST_PATHS  colon-separated host paths that must not be visible
//	ESCAPE_MARKER      a file name planted in another sandbox
//
// Nothing here changes the host when a route is open: see package escape.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/escape"
)

type attempt func() (escape.Verdict, string)

var attempts = map[string]attempt{
	"core-pattern":     func() (escape.Verdict, string) { return writeBack("/proc/sys/kernel/core_pattern") },
	"host-sysctls":     hostSysctls,
	"sysrq-trigger":    sysrq,
	"proc-kcore":       kcore,
	"proc-masked":      procMasked,
	"kallsyms":         kallsyms,
	"kernel-log":       kernelLog,
	"mount-proc":       func() (escape.Verdict, string) { return mount("proc", "", "proc", "") },
	"mount-sysfs":      func() (escape.Verdict, string) { return mount("sysfs", "", "sysfs", "") },
	"mount-cgroup-v1":  func() (escape.Verdict, string) { return mount("cgroup", "", "cgroup", "memory") },
	"mount-cgroup2":    func() (escape.Verdict, string) { return mount("cgroup2", "", "cgroup2", "") },
	"mount-tmpfs-proc": func() (escape.Verdict, string) { return mount("tmpfs", "/proc", "tmpfs", "size=1m") },
	"mount-debugfs":    func() (escape.Verdict, string) { return mount("debugfs", "", "debugfs", "") },
	"mount-tracefs":    func() (escape.Verdict, string) { return mount("tracefs", "", "tracefs", "") },
	"mount-bpffs":      func() (escape.Verdict, string) { return mount("bpf", "", "bpf", "") },
	"block-device":     blockDevice,
	"char-device":      func() (escape.Verdict, string) { return mknodRead("/tmp/escape-kmsg", unix.S_IFCHR, 1, 11) },
	"devices":          devices,
	"open-by-handle":   openByHandle,
	"ptrace-init":      ptraceInit,
	"ptrace-host":      ptraceHost,
	"signal-host":      signalHost,
	"bpf":              func() (escape.Verdict, string) { return rawCall("bpf", unix.SYS_BPF, 5, 0, 0) },
	"perf-event-open": func() (escape.Verdict, string) {
		return rawCall("perf_event_open", unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0))
	},
	"keyctl":          keyctl,
	"kernel-module":   kernelModule,
	"reboot":          func() (escape.Verdict, string) { return rawCall("reboot", unix.SYS_REBOOT, 0, 0, 0) },
	"clock":           func() (escape.Verdict, string) { return rawCall("settimeofday", unix.SYS_SETTIMEOFDAY, 0, 0, 0) },
	"swapon":          swapon,
	"userns-mount":    usernsMount,
	"init-exe":        initExe,
	"chroot-breakout": chrootBreakout,
	"host-paths":      hostPaths,
	"network":         network,
	"btrfs-subvolume": btrfsSubvolume,
}

func main() {
	if len(os.Args) == 2 {
		switch os.Args[1] {
		case "userns-child":
			os.Exit(usernsChild())
		case "chroot-child":
			os.Exit(chrootChild())
		}
	}
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: probe (runs every route of the escape suite)")
		os.Exit(2)
	}
	// The probe mounts over /proc and writes sysctls back: never on a host.
	if _, err := os.Stat("/.arbor/init"); err != nil || os.Getpid() > 1000 {
		fmt.Fprintln(os.Stderr, "probe: not inside an Arbor sandbox (no /.arbor/init, or not in a fresh pid namespace): refusing to run")
		os.Exit(2)
	}
	os.MkdirAll("/tmp", 0o1777)
	enc := json.NewEncoder(os.Stdout)
	for _, r := range escape.Routes {
		a, ok := attempts[r.Name]
		if !ok {
			fmt.Fprintf(os.Stderr, "probe: no attempt for route %s\n", r.Name)
			os.Exit(2)
		}
		v, detail := a()
		enc.Encode(escape.Result{Route: r.Name, Verdict: v, Detail: detail})
	}
}

// writeBack writes a file's own content back to it.
func writeBack(path string) (escape.Verdict, string) {
	old, err := os.ReadFile(path)
	if err != nil {
		return escape.Blocked, "read: " + err.Error()
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return escape.Blocked, "open for write: " + err.Error()
	}
	defer f.Close()
	if _, err := f.Write(old); err != nil {
		return escape.Blocked, "write: " + err.Error()
	}
	return escape.Open, fmt.Sprintf("wrote %q back", strings.TrimSpace(string(old)))
}

func hostSysctls() (escape.Verdict, string) {
	var seen []string
	for _, p := range []string{"kernel/modprobe", "kernel/panic", "vm/overcommit_memory", "fs/suid_dumpable"} {
		full := "/proc/sys/" + p
		if _, err := os.Stat(full); err != nil {
			continue
		}
		v, d := writeBack(full)
		if v == escape.Open {
			return v, p + ": " + d
		}
		seen = append(seen, p+": "+d)
	}
	if len(seen) == 0 {
		return escape.Blocked, "no such sysctl visible"
	}
	return escape.Blocked, strings.Join(seen, "; ")
}

func sysrq() (escape.Verdict, string) {
	err := unix.Access("/proc/sysrq-trigger", unix.W_OK)
	if err != nil {
		return escape.Blocked, "access W_OK: " + err.Error()
	}
	return escape.Open, "writable (not written)"
}

// readSome reads up to n bytes of path.
func readSome(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := f.Read(b)
	if k > 0 {
		return b[:k], nil
	}
	if err != nil && err.Error() != "EOF" {
		return nil, err
	}
	return nil, nil
}

func kcore() (escape.Verdict, string) {
	b, err := readSome("/proc/kcore", 16)
	if err != nil {
		return escape.Blocked, "read: " + err.Error()
	}
	if len(b) == 0 {
		return escape.Blocked, "reads nothing"
	}
	return escape.Open, fmt.Sprintf("read %d bytes", len(b))
}

func procMasked() (escape.Verdict, string) {
	var seen []string
	for _, p := range []string{"/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		b, err := readSome(p, 256)
		if err == nil && len(b) > 0 {
			return escape.Open, fmt.Sprintf("%s: read %d bytes", p, len(b))
		}
		seen = append(seen, fmt.Sprintf("%s: %v, %d bytes", p, err, len(b)))
	}
	if len(seen) == 0 {
		return escape.Blocked, "none present"
	}
	return escape.Blocked, strings.Join(seen, "; ")
}

func kallsyms() (escape.Verdict, string) {
	b, err := readSome("/proc/kallsyms", 64<<10)
	if err != nil {
		return escape.Blocked, "read: " + err.Error()
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if strings.Trim(f[0], "0") != "" {
			return escape.Open, "address " + f[0] + " for " + f[2]
		}
	}
	return escape.Blocked, "all addresses read as zero"
}

func kernelLog() (escape.Verdict, string) {
	buf := make([]byte, 4096)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return escape.Blocked, "syslog: " + err.Error()
	}
	return escape.Open, fmt.Sprintf("read %d bytes of the kernel log", n)
}

// mount tries a mount on target (a fresh directory when empty) and undoes
// it when it worked.
func mount(src, target, fstype, data string) (escape.Verdict, string) {
	if target == "" {
		target = "/tmp/escape-mnt-" + fstype
		if err := os.MkdirAll(target, 0o755); err != nil {
			return escape.Blocked, "mkdir: " + err.Error()
		}
		defer os.Remove(target)
	}
	if err := unix.Mount(src, target, fstype, 0, data); err != nil {
		return escape.Blocked, "mount: " + err.Error()
	}
	detail := "mounted " + fstype + " on " + target
	if fstype == "cgroup" {
		if _, err := os.Stat(filepath.Join(target, "release_agent")); err == nil {
			detail += " (release_agent visible)"
		}
	}
	unix.Unmount(target, unix.MNT_DETACH)
	return escape.Open, detail
}

func blockDevice() (escape.Verdict, string) {
	maj, min, ok := strings.Cut(os.Getenv("ESCAPE_HOST_DEV"), ":")
	ma, err1 := strconv.Atoi(maj)
	mi, err2 := strconv.Atoi(min)
	if !ok || err1 != nil || err2 != nil {
		return escape.Blocked, "ESCAPE_HOST_DEV not set: nothing to try"
	}
	return mknodRead("/tmp/escape-blk", unix.S_IFBLK, uint32(ma), uint32(mi))
}

// mknodRead makes a device node and reads from it.
func mknodRead(path string, kind uint32, major, minor uint32) (escape.Verdict, string) {
	os.Remove(path)
	if err := unix.Mknod(path, kind|0o600, int(unix.Mkdev(major, minor))); err != nil {
		return escape.Blocked, "mknod: " + err.Error()
	}
	defer os.Remove(path)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return escape.Blocked, "open: " + err.Error()
	}
	defer unix.Close(fd)
	b := make([]byte, 512)
	n, err := unix.Read(fd, b)
	if err != nil && n <= 0 && !errors.Is(err, unix.EAGAIN) {
		return escape.Blocked, "read: " + err.Error()
	}
	return escape.Open, fmt.Sprintf("opened %d:%d and read %d bytes", major, minor, max(n, 0))
}

func devices() (escape.Verdict, string) {
	allowed := map[uint64]bool{}
	for _, d := range [][2]uint32{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 2}} {
		allowed[unix.Mkdev(d[0], d[1])] = true
	}
	var extra []string
	filepath.WalkDir("/dev", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&(fs.ModeDevice|fs.ModeCharDevice) == 0 {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && (allowed[st.Rdev] || unix.Major(st.Rdev) == 136) {
			return nil
		}
		extra = append(extra, fmt.Sprintf("%s (%d:%d)", p, unix.Major(st.Rdev), unix.Minor(st.Rdev)))
		return nil
	})
	if len(extra) > 0 {
		return escape.Open, "device nodes beyond the allowed set: " + strings.Join(extra, ", ")
	}
	return escape.Blocked, "only the allowed device nodes"
}

func openByHandle() (escape.Verdict, string) {
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
	if err != nil {
		return escape.Blocked, "name_to_handle_at: " + err.Error()
	}
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return escape.Blocked, "open /: " + err.Error()
	}
	defer unix.Close(root)
	fd, err := unix.OpenByHandleAt(root, h, unix.O_RDONLY)
	if err != nil {
		return escape.Blocked, "open_by_handle_at: " + err.Error()
	}
	unix.Close(fd)
	return escape.Open, "opened the root directory by handle"
}

func ptraceInit() (escape.Verdict, string) {
	// Listing /proc/1/fd takes only permission on the directory; opening
	// what an entry points to takes ptrace access to init.
	ents, err := os.ReadDir("/proc/1/fd")
	if err != nil {
		return escape.Blocked, "list /proc/1/fd: " + err.Error()
	}
	seen := map[string]int{}
	for _, e := range ents {
		fd, err := unix.Open("/proc/1/fd/"+e.Name(), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err == nil {
			unix.Close(fd)
			return escape.Open, "opened /proc/1/fd/" + e.Name()
		}
		seen[err.Error()]++
	}
	if f, err := os.Open("/proc/1/mem"); err == nil {
		f.Close()
		return escape.Open, "opened /proc/1/mem"
	} else {
		seen["mem: "+err.Error()]++
	}
	var d []string
	for k, n := range seen {
		d = append(d, fmt.Sprintf("%s (%d)", k, n))
	}
	sort.Strings(d)
	return escape.Blocked, "opening init's descriptors and memory: " + strings.Join(d, "; ")
}

func hostPID() (int, bool) {
	pid, err := strconv.Atoi(os.Getenv("ESCAPE_HOST_PID"))
	return pid, err == nil && pid > 0
}

func ptraceHost() (escape.Verdict, string) {
	pid, ok := hostPID()
	if !ok {
		return escape.Blocked, "ESCAPE_HOST_PID not set: nothing to try"
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		return escape.Open, fmt.Sprintf("pid %d is visible", pid)
	}
	if err := unix.PtraceAttach(pid); err != nil {
		return escape.Blocked, "ptrace attach: " + err.Error()
	}
	unix.PtraceDetach(pid)
	return escape.Open, fmt.Sprintf("attached to pid %d", pid)
}

func signalHost() (escape.Verdict, string) {
	pid, ok := hostPID()
	if !ok {
		return escape.Blocked, "ESCAPE_HOST_PID not set: nothing to try"
	}
	if err := unix.Kill(pid, 0); err != nil {
		return escape.Blocked, "kill 0: " + err.Error()
	}
	return escape.Open, fmt.Sprintf("pid %d can be signalled", pid)
}

// rawCall makes a system call with arguments the kernel rejects once it
// has checked permission: EPERM (or ENOSYS) means the call is closed, any
// other answer that the kernel went on to look at the arguments.
func rawCall(name string, nr, a1, a2, a3 uintptr) (escape.Verdict, string) {
	_, _, e := unix.Syscall(nr, a1, a2, a3)
	switch e {
	case unix.EPERM, unix.EACCES, unix.ENOSYS:
		return escape.Blocked, name + ": " + e.Error()
	case 0:
		return escape.Open, name + ": succeeded"
	}
	return escape.Open, name + ": passed the permission check (" + e.Error() + ")"
}

func keyctl() (escape.Verdict, string) {
	_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EACCES) {
		return escape.Blocked, "keyctl: " + err.Error()
	}
	return escape.Open, fmt.Sprintf("keyctl answered (%v)", err)
}

func kernelModule() (escape.Verdict, string) {
	v1, d1 := rawCall("init_module", unix.SYS_INIT_MODULE, 0, 0, 0)
	v2, d2 := rawCall("finit_module", unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0)
	if v1 == escape.Open || v2 == escape.Open {
		return escape.Open, d1 + "; " + d2
	}
	return escape.Blocked, d1 + "; " + d2
}

func swapon() (escape.Verdict, string) {
	p, _ := unix.BytePtrFromString("/nonexistent-escape-swap")
	_, _, e := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), 0, 0)
	if e == unix.EPERM || e == unix.ENOSYS {
		return escape.Blocked, "swapon: " + e.Error()
	}
	return escape.Open, "swapon passed the permission check (" + e.Error() + ")"
}

func usernsMount() (escape.Verdict, string) {
	cmd := exec.Command("/proc/self/exe", "userns-child")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return escape.Blocked, fmt.Sprintf("new user namespace: %v %s", err, bytes.TrimSpace(out))
	}
	return escape.Open, "in a new user namespace: " + string(bytes.TrimSpace(out))
}

func usernsChild() int {
	dir := "/tmp/escape-userns"
	os.MkdirAll(dir, 0o755)
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Printf("make mounts private: %v", err)
		return 1
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		fmt.Printf("mount tmpfs: %v", err)
		return 1
	}
	fmt.Print("mounted a tmpfs")
	return 0
}

func initExe() (escape.Verdict, string) {
	var seen []string
	for _, p := range []string{"/proc/1/exe", "/.arbor/init"} {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			f.Close()
			return escape.Open, p + " opened for writing (nothing written)"
		}
		seen = append(seen, p+": "+err.Error())
	}
	return escape.Blocked, strings.Join(seen, "; ")
}

func chrootBreakout() (escape.Verdict, string) {
	out, err := exec.Command("/proc/self/exe", "chroot-child").CombinedOutput()
	s := string(bytes.TrimSpace(out))
	switch {
	case err == nil:
		return escape.Blocked, s
	case strings.HasPrefix(s, "open:"):
		return escape.Open, s
	}
	return escape.Blocked, fmt.Sprintf("%v %s", err, s)
}

// chrootChild exits 0 when the breakout ends at the sandbox's own root,
// 1 (printing "open: ...") when it reaches anything else.
func chrootChild() int {
	dir := "/tmp/escape-chroot/inner"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("mkdir: %v", err)
		return 2
	}
	if err := unix.Chroot(dir); err != nil {
		fmt.Printf("chroot: %v", err)
		return 0
	}
	for i := 0; i < 64; i++ {
		unix.Chdir("..")
	}
	if err := unix.Chroot("."); err != nil {
		fmt.Printf("chroot .: %v", err)
		return 0
	}
	if v, d := hostPaths(); v == escape.Open {
		fmt.Printf("open: after the breakout: %s", d)
		return 1
	}
	if _, err := os.Stat("/.arbor"); err != nil {
		fmt.Printf("open: after the breakout / is not the sandbox root (%v)", err)
		return 1
	}
	fmt.Print("climbed out of the chroot to the sandbox's own root")
	return 0
}

func hostPaths() (escape.Verdict, string) {
	for _, p := range filepath.SplitList(os.Getenv("ESCAPE_HOST_PATHS")) {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return escape.Open, p + " is visible"
		}
	}
	if m := os.Getenv("ESCAPE_MARKER"); m != "" {
		found := ""
		filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
				return filepath.SkipDir
			}
			if d.Name() == m {
				found = p
				return fs.SkipAll
			}
			return nil
		})
		if found != "" {
			return escape.Open, "another sandbox's file is visible at " + found
		}
	}
	return escape.Blocked, "no host path or other sandbox's file visible"
}

func network() (escape.Verdict, string) {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return escape.Blocked, "read /proc/net/dev: " + err.Error()
	}
	var ifs []string
	for _, line := range strings.Split(string(b), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		ifs = append(ifs, strings.TrimSpace(name))
	}
	for _, i := range ifs {
		if i != "lo" {
			return escape.Open, "interfaces: " + strings.Join(ifs, ", ")
		}
	}
	return escape.Blocked, "interfaces: " + strings.Join(ifs, ", ")
}

// btrfs ioctls that make a subvolume (which a sandbox's disk quota does not
// cover) and the one that removes one; from linux/btrfs.h.
const (
	btrfsSnapCreate     = 0x50009401
	btrfsSubvolCreate   = 0x5000940e
	btrfsSnapCreateV2   = 0x50009417
	btrfsSubvolCreateV2 = 0x50009418
	btrfsSnapDestroy    = 0x5000940f
)

// btrfsVolArgs is struct btrfs_ioctl_vol_args; the v2 struct has the same
// size (4096 bytes) with the name at offset 40 instead of 8, and an fd at 0
// in both.
type btrfsVolArgs [4096]byte

func volArgs(v2 bool, fd int, name string) *btrfsVolArgs {
	var a btrfsVolArgs
	binary.LittleEndian.PutUint64(a[0:8], uint64(fd))
	off := 8
	if v2 {
		off = 40
	}
	copy(a[off:], name)
	return &a
}

func btrfsSubvolume() (escape.Verdict, string) {
	dir := "/tmp/escape-subvol"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return escape.Blocked, "mkdir: " + err.Error()
	}
	defer os.Remove(dir)
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return escape.Blocked, "open dir: " + err.Error()
	}
	defer unix.Close(dfd)
	rootfd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return escape.Blocked, "open /: " + err.Error()
	}
	defer unix.Close(rootfd)
	var seen []string
	for _, c := range []struct {
		name string
		req  uintptr
		v2   bool
		fd   int
	}{
		{"SUBVOL_CREATE", btrfsSubvolCreate, false, 0},
		{"SUBVOL_CREATE_V2", btrfsSubvolCreateV2, true, 0},
		{"SNAP_CREATE", btrfsSnapCreate, false, rootfd},
		{"SNAP_CREATE_V2", btrfsSnapCreateV2, true, rootfd},
	} {
		name := "sv-" + strings.ToLower(c.name)
		a := volArgs(c.v2, c.fd, name)
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(dfd), c.req, uintptr(unsafe.Pointer(a)))
		if e == 0 {
			// Undo: an empty subvolume can be removed like a directory.
			if err := unix.Rmdir(filepath.Join(dir, name)); err != nil {
				unix.Syscall(unix.SYS_IOCTL, uintptr(dfd), btrfsSnapDestroy, uintptr(unsafe.Pointer(volArgs(false, 0, name))))
			}
			return escape.Open, "made a subvolume with " + c.name
		}
		seen = append(seen, c.name+": "+e.Error())
	}
	return escape.Blocked, strings.Join(seen, "; ")
}
