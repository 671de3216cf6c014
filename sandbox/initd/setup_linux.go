package initd

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/loopback"
	"github.com/arbor-env/arbor/sandbox/ctl"
)

// SetupOptions configure stage one.
type SetupOptions struct {
	// Root is the sandbox root as seen before pivoting (a host path).
	Root string
	// Hostname for the new UTS namespace.
	Hostname string
	// SyncFD is read once: the server writes a byte after it has put this
	// process into the sandbox's cgroups.
	SyncFD int
	// ReadyFD is passed on to stage two, which reports "ok" or an error on it.
	ReadyFD int
	// Harden, when set, is applied before stage two starts; its seccomp
	// program is read from SeccompFD. Nil leaves the sandbox unhardened.
	Harden    *Hardening
	SeccompFD int
}

// Setup runs as pid 1 of fresh mount, pid, uts, ipc and net namespaces. It
// mounts /proc, a minimal /dev and devpts, pivots into Root, brings up
// loopback, masks /proc, drops its privileges (o.Harden) and re-executes
// the init binary from inside the root as stage two. It only returns on
// error, after reporting it on the ready descriptor.
func Setup(o SetupOptions) error {
	err := setup(&o)
	if err != nil {
		// o.ReadyFD follows the pipe to readyFD once it is moved there:
		// its first descriptor may be the control channel's by then.
		fmt.Fprintf(os.NewFile(uintptr(o.ReadyFD), "ready"), "error: setup: %v\n", err)
	}
	return err
}

func setup(o *SetupOptions) error {
	// First, before stage one opens anything: the channel's numbers are
	// far above those the runtime and stage one take (the poller's, the
	// cgroup files the runtime keeps open for GOMAXPROCS), and an open
	// descriptor there is an error, never overwritten.
	if err := makeChannel(); err != nil {
		return err
	}
	b := make([]byte, 1)
	if n, err := unix.Read(o.SyncFD, b); err != nil || n != 1 {
		return fmt.Errorf("wait for cgroup placement: n=%d err=%v", n, err)
	}
	unix.Close(o.SyncFD)
	if o.Harden != nil {
		var err error
		if o.Harden.Seccomp, err = readSeccomp(o.SeccompFD); err != nil {
			return err
		}
	}
	// The shell and what it runs may be OOM-killed; init may not. Lowering
	// the score needs CAP_SYS_RESOURCE, so it happens before the drop (the
	// value survives the exec into stage two). Best effort: a server that
	// lacks the capability itself (this VM's root, some CI containers)
	// cannot grant it; then agentOOMScore still has the kernel take an
	// agent process first.
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	r := o.Root
	if err := unix.Mount(r, r, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind root %s: %w", r, err)
	}
	// Only /proc and /dev/pts are mounts: /dev itself and /dev/shm are
	// directories of the root file system, so they are part of its
	// snapshots and CRIU has no tmpfs to archive at every dump.
	if err := makeDev(r, o.Harden != nil); err != nil {
		return err
	}
	mounts := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devpts", "dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
	}
	for _, m := range mounts {
		dst := filepath.Join(r, m.dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", dst, err)
		}
		if err := unix.Mount(m.src, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, dst, err)
		}
	}
	if err := os.Chdir(r); err != nil {
		return fmt.Errorf("chdir root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root %s: %w", r, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	// User namespace mode (userns_linux.go): from here on root of the
	// sandbox's own user namespace.
	if err := becomeNSRoot(); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(o.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := loopback.Up(); err != nil {
		return err
	}
	if o.Harden != nil {
		if err := maskProc(); err != nil {
			return err
		}
	}
	null, err := unix.Open("/dev/null", unix.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/null: %w", err)
	}
	for fd := 0; fd < 3; fd++ {
		if err := unix.Dup2(null, fd); err != nil {
			return fmt.Errorf("dup2 /dev/null: %w", err)
		}
	}
	if null > 2 {
		unix.Close(null)
	}
	if err := unix.Dup2(o.ReadyFD, readyFD); err != nil {
		return fmt.Errorf("dup2 ready fd: %w", err)
	}
	o.ReadyFD = readyFD
	// Nothing else the server (or whoever started it) left open may
	// reach stage two: a descriptor pointing outside the sandbox makes a
	// CRIU dump fail, and it would leak host resources into the sandbox.
	if err := unix.CloseRange(readyFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close inherited descriptors: %w", err)
	}
	for _, fd := range []int{ctl.ChannelFD, ctl.ServerEndFD} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("keep the control channel: %w", err)
		}
	}
	if o.Harden != nil {
		if err := harden(*o.Harden); err != nil {
			return err
		}
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if v := os.Getenv(ptyHoldEnv); v != "" {
		env = append(env, ptyHoldEnv+"="+v) // tests only (pty_linux.go)
	}
	return unix.Exec("/.arbor/init", []string{"arbor-init", "run"}, env)
}

// makeChannel makes the control channel (see package ctl): a unix stream
// socket pair whose ends land on ctl.ChannelFD and ctl.ServerEndFD, which
// stage one keeps open across the exec into stage two. Both ends are
// init's, so the channel is part of every CRIU dump of the tree and
// nothing in its file tree or namespaces names it.
func makeChannel() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("control channel: %w", err)
	}
	for i := range fds {
		// An end may sit on the other's target: move both above them
		// first.
		moved, err := unix.FcntlInt(uintptr(fds[i]), unix.F_DUPFD_CLOEXEC, ctl.ServerEndFD+1)
		if err != nil {
			return fmt.Errorf("control channel: %w", err)
		}
		unix.Close(fds[i])
		fds[i] = moved
	}
	for i, want := range []int{ctl.ChannelFD, ctl.ServerEndFD} {
		if _, err := unix.FcntlInt(uintptr(want), unix.F_GETFD, 0); err == nil {
			return fmt.Errorf("control channel: descriptor %d is taken", want)
		}
		// Close-on-exec until stage one is about to exec (closing the
		// server's other descriptors marks them too); stage two marks
		// them again before it starts anything.
		if err := unix.Dup3(fds[i], want, unix.O_CLOEXEC); err != nil {
			return fmt.Errorf("control channel: %w", err)
		}
		unix.Close(fds[i])
	}
	return nil
}

// makeDev fills root/dev with the device nodes and links a sandbox needs,
// leaving what is already right alone. Nodes are made, not bind-mounted
// from the host: bind mounts of host nodes would be external mounts for
// CRIU. A hardened sandbox also loses every other device node directly in
// /dev (an image's console, say): the devices cgroup would refuse them
// anyway, and /dev should show what the sandbox can use.
func makeDev(r string, hardened bool) error {
	dev := filepath.Join(r, "dev")
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{dev, 0o755}, {filepath.Join(dev, "pts"), 0o755}, {filepath.Join(dev, "shm"), 0o1777}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return fmt.Errorf("mkdir %s: %w", d.path, err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", d.path, err)
		}
	}
	devs := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	if !hasBash(r) {
		// busybox ash opens /dev/tty for job control and its forked
		// subshells inherit it; CRIU refuses to dump a tree in which a
		// process other than the session leader holds the controlling
		// terminal that way. Without /dev/tty ash uses its stderr, as
		// bash always does.
		devs = devs[:len(devs)-1]
		os.Remove(filepath.Join(dev, "tty"))
	}
	if hardened {
		if err := removeOtherDevices(dev, devs); err != nil {
			return err
		}
	}
	for _, d := range devs {
		p := filepath.Join(dev, d.name)
		want := unix.Mkdev(d.major, d.minor)
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == want {
			continue
		}
		os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(want)); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := unix.Chmod(p, 0o666); err != nil {
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	// ptmx must be the sandbox's own devpts instance, never a host node.
	links := [][2]string{{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}}
	for _, l := range links {
		p := filepath.Join(dev, l[1])
		if t, err := os.Readlink(p); err == nil && t == l[0] {
			continue
		}
		os.RemoveAll(p)
		if err := os.Symlink(l[0], p); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", l[1], err)
		}
	}
	return nil
}

// removeOtherDevices deletes the character and block nodes in dev that
// are not the ones keep names with the right numbers.
func removeOtherDevices(dev string, keep []struct {
	name         string
	major, minor uint32
}) error {
	ents, err := os.ReadDir(dev)
	if err != nil {
		return fmt.Errorf("read %s: %w", dev, err)
	}
	for _, e := range ents {
		if e.Type()&(os.ModeDevice|os.ModeCharDevice) == 0 {
			continue
		}
		p := filepath.Join(dev, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			continue
		}
		ok := false
		for _, k := range keep {
			if k.name == e.Name() && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(k.major, k.minor) {
				ok = true
			}
		}
		if !ok {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("remove device %s: %w", p, err)
			}
		}
	}
	return nil
}

// hasBash reports whether the root has bash, the shell stage two prefers.
func hasBash(root string) bool {
	for _, p := range bashPaths {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			return true
		}
	}
	return false
}

// bashPaths are where stage two looks for bash, in order.
var bashPaths = []string{"/bin/bash", "/usr/bin/bash"}

// readyFD is where stage two finds the server's ready pipe.
const readyFD = 3

// agentOOMScore is the oom_score_adj of the shell and of every process it
// starts (they inherit it). Positive, so that the OOM killer of a sandbox
// at its memory limit picks any agent process before init even where init
// could not lower its own score to -1000 (no CAP_SYS_RESOURCE): a score of
// 500 counts as half the cgroup's limit in pages, far above init's few
// MB. Without it a second OOM kill while the first victim was still
// exiting took init, and the sandbox died (TestMemoryHogStoppedByMemoryLimit
// under load). Raising a score needs no privilege; an agent may lower its
// own back to 0 and so only put its own sandbox at risk.
const agentOOMScore = "500"

// setAgentOOMScore gives process pid agentOOMScore (best effort).
func setAgentOOMScore(pid int) {
	os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(agentOOMScore), 0)
}
