package criu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/magic"
	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// noState marks a /proc item that is no state a restore must bring back:
// a statistic, an identity, a view of state another row covers, an action.
const noState = "-"

// procEntries maps each entry of /proc/PID to the row of docs/inspector.md's
// "Kernel objects" table that covers it.
var procEntries = map[string]string{
	"arch_status": "proc:arch", "attr": "creds", "autogroup": "sched:autogroup", "auxv": "proc:exe",
	"cgroup": "cgroup", "clear_refs": noState, "cmdline": "proc:exe", "comm": "proc:exe",
	"coredump_filter": "proc:coredump", "cpuset": "cgroup", "cpu_resctrl_groups": "cgroup", "cwd": "cwd",
	"environ": "proc:exe", "exe": "proc:exe", "fd": "fd:file", "fdinfo": "fd:file", "gid_map": "ns:user",
	"io": noState, "ksm_merging_pages": "mem:ksm", "ksm_stat": "mem:ksm", "latency": noState,
	"limits": "rlimit", "loginuid": "proc:loginuid", "map_files": "mem:mappings", "maps": "mem:mappings",
	"mem": "mem:pages", "mountinfo": "ns:mnt", "mounts": "ns:mnt", "mountstats": "ns:mnt", "net": "ns:net",
	"ns":        noState, // each entry below
	"numa_maps": "mem:numa", "oom_adj": "mem:oom", "oom_score": noState, "oom_score_adj": "mem:oom",
	"pagemap": "mem:pages", "patch_state": noState, "personality": "proc:personality",
	"projid_map": "ns:user", "root": "cwd", "sched": "sched:policy", "schedstat": noState,
	"seccomp_cache": noState, "sessionid": "proc:loginuid", "setgroups": "ns:user",
	"smaps": "mem:mappings", "smaps_rollup": "mem:mappings", "stack": noState, "stat": "proc:tree",
	"statm": noState, "status": noState, // each field below
	"syscall": noState, "task": "proc:tree", "timens_offsets": "ns:time", "timers": "timer:posix",
	"timerslack_ns": "timer:slack", "uid_map": "ns:user", "wchan": noState,
}

// statusFields maps each field of /proc/PID/status to its row.
var statusFields = map[string]string{
	"Name": "proc:exe", "Umask": "cwd", "State": "proc:state", "Tgid": "proc:tree", "Ngid": noState,
	"Pid": "proc:tree", "PPid": "proc:tree", "TracerPid": noState, // ptrace makes the turn full
	"Uid": "creds", "Gid": "creds", "FDSize": noState, "Groups": "creds",
	"NStgid": "proc:tree", "NSpid": "proc:tree", "NSpgid": "proc:tree", "NSsid": "proc:tree",
	"Kthread": noState, "VmPeak": noState, "VmSize": noState, "VmLck": "mem:mappings", "VmPin": noState,
	"VmHWM": noState, "VmRSS": noState, "RssAnon": noState, "RssFile": noState, "RssShmem": noState,
	"VmData": noState, "VmStk": noState, "VmExe": noState, "VmLib": noState, "VmPTE": noState,
	"VmSwap": noState, "HugetlbPages": noState, "CoreDumping": "proc:coredump",
	"THP_enabled": "mem:mappings", "untag_mask": "proc:arch", "Threads": "proc:tree",
	"SigQ": "sig:pending", "SigPnd": "sig:pending", "ShdPnd": "sig:pending", "SigBlk": "sig:mask",
	"SigIgn": "sig:handlers", "SigCgt": "sig:handlers", "CapInh": "creds", "CapPrm": "creds",
	"CapEff": "creds", "CapBnd": "creds", "CapAmb": "creds", "NoNewPrivs": "creds",
	"Seccomp": "seccomp", "Seccomp_filters": "seccomp",
	"Speculation_Store_Bypass": "proc:speculation", "SpeculationIndirectBranch": "proc:speculation",
	"Cpus_allowed": "sched:affinity", "Cpus_allowed_list": "sched:affinity",
	"Mems_allowed": "mem:numa", "Mems_allowed_list": "mem:numa",
	"voluntary_ctxt_switches": noState, "nonvoluntary_ctxt_switches": noState,
	"x86_Thread_features": "proc:arch", "x86_Thread_features_locked": "proc:arch",
}

// nsEntries maps each entry of /proc/PID/ns to its row.
var nsEntries = map[string]string{
	"cgroup": "ns:cgroup", "ipc": "ns:ipc", "mnt": "ns:mnt", "net": "ns:net", "pid": "ns:pid",
	"pid_for_children": "ns:pid", "time": "ns:time", "time_for_children": "ns:time",
	"user": "ns:user", "uts": "ns:uts",
}

// sysvipcEntries maps each entry of /proc/sysvipc to its row.
var sysvipcEntries = map[string]string{"msg": "ipc:msg", "sem": "ipc:sem", "shm": "ipc:shm"}

// fdClasses maps the class of a descriptor's /proc/PID/fd link target
// (its text without the ":[inode]" of pipes and sockets) to its row.
var fdClasses = map[string]string{
	"file": "fd:file", "dir": "fd:dir", "memfd": "fd:memfd", "pipe": "fd:pipe",
	"socket":               "fd:socket-unix", // the only family the test opens
	"anon_inode:[eventfd]": "fd:eventfd", "anon_inode:[eventpoll]": "fd:eventpoll",
	"anon_inode:[signalfd]": "fd:signalfd", "anon_inode:[timerfd]": "fd:timerfd",
	"anon_inode:inotify": "fd:inotify", "anon_inode:[pidfd]": "fd:pidfd",
}

// fdinfoFields maps each field of /proc/PID/fdinfo/N to its row.
var fdinfoFields = map[string]string{
	"pos": "fd:file", "flags": "fd:file", "mnt_id": noState, "ino": noState, "lock": "fd:lock",
	"eventfd-count": "fd:eventfd", "eventfd-id": noState, "eventfd-semaphore": "fd:eventfd",
	"tfd": "fd:eventpoll", "sigmask": "fd:signalfd",
	"clockid": "fd:timerfd", "ticks": "fd:timerfd", "settime flags": "fd:timerfd",
	"it_value": "fd:timerfd", "it_interval": "fd:timerfd",
	"inotify wd": "fd:inotify", "Pid": "fd:pidfd", "NSpid": "fd:pidfd",
	"scm_fds": "fd:socket-unix", // descriptors in flight in its queue
}

// namedRows are the rows no /proc listing here shows: descriptors the
// test cannot open without privilege or a peer, state read only through
// a system call, and the shell's builtins.
var namedRows = []string{
	"fd:deleted", "fd:fifo", "fd:socket-inet", "fd:socket-netlink", "fd:socket-packet",
	"fd:fanotify", "fd:tty", "fd:ns", "fd:io_uring", "fd:userfaultfd", "fd:bpf", "fd:perf_event",
	"ipc:mqueue", "ipc:sysctl", "timer:itimer", "sched:nice", "sched:ioprio", "proc:subreaper",
	"shell:vars", "shell:functions", "shell:aliases", "shell:options", "shell:traps", "shell:dirs",
	"shell:umask", "shell:limits", "shell:jobs", "shell:hash", "shell:history", "shell:completion",
	"shell:enable", "shell:readline", "shell:random", "shell:getopts",
}

// classify fails the test for each name m lacks: the kernel shows
// something no row was judged for.
func classify(t *testing.T, what string, names []string, m map[string]string) {
	t.Helper()
	for _, n := range names {
		if _, ok := m[n]; !ok {
			t.Errorf("%s %q is in no row of %s's \"Kernel objects\" (and not marked as no state in this test): add one", what, n, inspectorDoc)
		}
	}
}

// requiredRows are the rows the "Kernel objects" table must have: every
// row a mapping names (whether or not this kernel shows the item: the
// table is the same on every host) and the named ones.
func requiredRows() map[string]bool {
	need := map[string]bool{}
	for _, m := range []map[string]string{procEntries, statusFields, nsEntries, sysvipcEntries, fdClasses, fdinfoFields} {
		for _, row := range m {
			if row != noState {
				need[row] = true
			}
		}
	}
	for _, r := range namedRows {
		need[r] = true
	}
	return need
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

var linkInode = regexp.MustCompile(`:\[[0-9]+\]$`)

// openKinds opens one descriptor of each kind the test can make without
// privilege and returns them; t.Cleanup closes them.
func openKinds(t *testing.T) []int {
	t.Helper()
	var fds []int
	keep := func(fd int, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
		return fd
	}
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	dir := t.TempDir()
	file := keep(unix.Open(filepath.Join(dir, "f"), unix.O_CREAT|unix.O_RDWR, 0o600))
	if err := unix.Flock(file, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	keep(unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0))
	keep(unix.MemfdCreate("cover", 0))
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil {
		t.Fatal(err)
	}
	fds = append(fds, p[0], p[1])
	keep(unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0))
	ev := keep(unix.Eventfd(0, 0))
	ep := keep(unix.EpollCreate1(0))
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ev, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ev)}); err != nil {
		t.Fatal(err)
	}
	keep(unix.Signalfd(-1, &unix.Sigset_t{}, 0))
	tfd := keep(unix.TimerfdCreate(unix.CLOCK_MONOTONIC, 0))
	if err := unix.TimerfdSettime(tfd, 0, &unix.ItimerSpec{Value: unix.Timespec{Sec: 1000}}, nil); err != nil {
		t.Fatal(err)
	}
	in := keep(unix.InotifyInit1(0))
	if _, err := unix.InotifyAddWatch(in, dir, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	keep(unix.PidfdOpen(os.Getpid(), 0))
	return fds
}

// TestInspectorTableCoversProcfs: every namespace, /proc/PID entry and
// status field this kernel shows, every SysV IPC kind, every descriptor
// kind the test opens and each of their fdinfo fields is mapped to a row
// of the "Kernel objects" table of docs/inspector.md (or marked as no
// state), and the table has exactly the rows mapped and named
// (requiredRows): so a row removed, or something new in the kernel,
// fails it.
func TestInspectorTableCoversProcfs(t *testing.T) {
	classify(t, "/proc/self/ns entry", dirNames(t, "/proc/self/ns"), nsEntries)
	classify(t, "/proc/self entry", dirNames(t, "/proc/self"), procEntries)
	classify(t, "/proc/sysvipc entry", dirNames(t, "/proc/sysvipc"), sysvipcEntries)

	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, line := range strings.Split(strings.TrimSpace(string(status)), "\n") {
		k, _, _ := strings.Cut(line, ":")
		fields = append(fields, k)
	}
	classify(t, "/proc/self/status field", fields, statusFields)

	var classes, infoFields []string
	for _, fd := range openKinds(t) {
		target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			t.Fatal(err)
		}
		class := linkInode.ReplaceAllString(target, "")
		if strings.HasPrefix(target, "/") {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			switch {
			case strings.HasPrefix(target, "/memfd:"):
				class = "memfd"
			case st.Mode&unix.S_IFMT == unix.S_IFDIR:
				class = "dir"
			case st.Mode&unix.S_IFMT == unix.S_IFREG:
				class = "file"
			}
		}
		classes = append(classes, class)
		info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(info)), "\n") {
			k, _, _ := strings.Cut(line, ":")
			infoFields = append(infoFields, strings.TrimSpace(k))
		}
	}
	slices.Sort(infoFields)
	infoFields = slices.Compact(infoFields)
	classify(t, "descriptor kind (link target)", classes, fdClasses)
	classify(t, "fdinfo field", infoFields, fdinfoFields)
	// The test must have seen what it maps: each descriptor kind, and the
	// fields that say a descriptor's position, flags and locks.
	for c := range fdClasses {
		if !slices.Contains(classes, c) {
			t.Errorf("opened no descriptor of kind %q (saw %q)", c, classes)
		}
	}
	for _, f := range []string{"pos", "flags", "lock", "tfd", "inotify wd", "it_value"} {
		if !slices.Contains(infoFields, f) {
			t.Errorf("no fdinfo field %q among %q", f, infoFields)
		}
	}
	sameKeys(t, inspectorDoc+", \"Kernel objects\"", requiredRows(), coverageRows(t, "Kernel objects"))
}

// templateRE turns an image name of the list ("core-%u") into a pattern
// of the file names CRIU makes from it.
func templateRE(name string) *regexp.Regexp {
	q := regexp.QuoteMeta(name)
	for _, v := range []struct{ verb, re string }{
		{"%lu", `[0-9]+`}, {"%ld", `-?[0-9]+`}, {"%u", `[0-9]+`}, {"%d", `-?[0-9]+`}, {"%x", `[0-9a-f]+`}, {"%s", `.+`},
	} {
		q = strings.ReplaceAll(q, v.verb, v.re)
	}
	return regexp.MustCompile("^" + q + "$")
}

// TestDumpImageFilesListed dumps a sandbox whose shell holds a few kinds
// of kernel object, as the engine does, and checks every image file CRIU
// wrote against the list (so against docs/inspector.md's table): each
// *.img file matches an image type of the list, and a file that starts
// with a magic number has the magic go-criu knows for that type.
func TestDumpImageFilesListed(t *testing.T) {
	types := imageTypes(t)
	c, snap := setup(t)
	sb := startSource(t, snap, "crcover", sandboxtest.BusyboxRoot(t, ""))
	ctx := context.Background()
	// A fifo with data queued, a pipe between two sleepers, a file
	// open for writing, a background process.
	for _, cmd := range []string{
		"mkfifo /tmp/p && exec 7<>/tmp/p && echo queued >&7",
		"exec 8>>/tmp/f",
		"sleep 1000 </dev/null 2>/dev/null | sleep 1000 >/dev/null 2>&1 &",
	} {
		if r, err := sb.Exec(ctx, cmd, sandbox.ExecOptions{}); err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %v %+v", cmd, err, r)
		}
	}
	imgs := t.TempDir()
	dump(t, c, snap, sb, "cover", imgs, false)

	res := map[string]*regexp.Regexp{}
	for name := range types {
		res[name] = templateRE(name)
	}
	magics := magic.LoadMagic().ByName
	seen := map[string]bool{}
	for _, f := range dirNames(t, imgs) {
		base, isImg := strings.CutSuffix(f, ".img")
		var match []string
		for name, re := range res {
			// stats-%s and irmap-cache are the two without ".img".
			if re.MatchString(base) && (isImg || name == "stats-%s" || name == "irmap-cache") {
				match = append(match, name)
			}
		}
		if !isImg && len(match) == 0 {
			continue // CRIU's log, Arbor's own files
		}
		if len(match) == 0 {
			t.Errorf("CRIU wrote %s, which matches no image type of %s", f, imageTypesFile)
			continue
		}
		head := make([]byte, 8)
		fh, err := os.Open(filepath.Join(imgs, f))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := fh.Read(head)
		fh.Close()
		first := uint64(binary.LittleEndian.Uint32(head[:4]))
		second := uint64(binary.LittleEndian.Uint32(head[4:]))
		// A file may match several entries (pages-1: pages-%u, raw, and
		// the old layout pages-%d): its magic must be that of one of
		// them, unless none has a magic go-criu knows (raw images, pages
		// and tarballs, have none).
		var checked, fits bool
		var entries []string
		for _, name := range match {
			seen[name] = true
			entries = append(entries, types[name])
			want, known := magics[types[name]]
			if !known || want == 0 {
				continue
			}
			checked = true
			// The inventory has its own magic only; the others CRIU's
			// image or service magic, then their own.
			if n == 8 && (first == want || (first == magics["IMG_COMMON"] || first == magics["IMG_SERVICE"]) && second == want) {
				fits = true
			}
		}
		if checked && !fits {
			t.Errorf("%s starts with %#x %#x: not the magic of %s, its entry in %s", f, first, second, strings.Join(entries, " or "), imageTypesFile)
		}
	}
	// The dump holds what the sandbox was made to hold.
	for _, name := range []string{"inventory", "pstree", "core-%u", "fdinfo-%u", "pages-%u", "fifo-data", "pipes-data", "files", "stats-%s"} {
		if !seen[name] {
			t.Errorf("the dump has no %s image (files: %q)", name, dirNames(t, imgs))
		}
	}
}
