package initd

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// makeDir creates what is missing of dir (absolute and clean), each new
// directory owned by uid:gid with mode 0755, as Docker does for a WORKDIR.
// Init runs it only until the sandbox's first shell has come up (see
// shell.start), when nothing the agent typed has run yet: later the path
// could lead through directories the agent owns, and init, which is root,
// would create directories, and give them away, wherever a symlink there
// points (an /etc/cron.d of the agent's).
func makeDir(dir string, uid, gid uint32) error {
	if isDir(dir) {
		return nil
	}
	// All of them first, then their owner: init may not write into a
	// directory it gave away unless it has CAP_DAC_OVERRIDE.
	var made []string
	p := ""
	for _, name := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		p += "/" + name
		err := unix.Mkdir(p, 0o755)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return fmt.Errorf("create shell directory %s: %w", p, err)
		}
		made = append(made, p)
	}
	for i := len(made) - 1; i >= 0; i-- {
		if err := ownDir(made[i], uid, gid); err != nil {
			return err
		}
	}
	if !isDir(dir) {
		return fmt.Errorf("shell directory %s: not a directory", dir)
	}
	return nil
}

func isDir(p string) bool {
	var st unix.Stat_t
	return unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// ownDir gives the directory makeDir just created to uid:gid with mode
// 0755 (whatever init's umask), through a descriptor opened without
// following a symlink.
func ownDir(p string, uid, gid uint32) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open shell directory %s: %w", p, err)
	}
	defer unix.Close(fd)
	// The mode first: once the directory is the user's, init may change
	// it only with CAP_FOWNER.
	if err := unix.Fchmod(fd, 0o755); err != nil {
		return fmt.Errorf("chmod shell directory %s: %w", p, err)
	}
	if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
		return fmt.Errorf("chown shell directory %s: %w", p, err)
	}
	return nil
}

// forkShell is syscall.ForkExec of the shell. For a shell that is not
// root's (noInheritable) it also empties the inheritable capability set
// the shell gets, as Docker does for every container since
// CVE-2022-24769: the kernel clears a non-root uid's permitted, effective
// and ambient sets at setuid, but not the inheritable one, which would
// hand file-inheritable capabilities of an image's binaries to the agent
// wherever no_new_privs does not stop it (an unhardened sandbox). The
// child gets the set of the thread that forks it, so it is cleared on this
// thread (init's main thread, locked: see cmd/arbor-init) around the fork
// and restored right after (init's dumpable flag with them); init's other
// threads keep theirs. A dump
// whose freeze lands in those microseconds records init without the set
// and fails its isolation check, which only refuses that dump.
func forkShell(path string, args []string, attr *syscall.ProcAttr, noInheritable bool) (int, error) {
	if !noInheritable {
		return syscall.ForkExec(path, args, attr)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	if saved[0].Inheritable == 0 && saved[1].Inheritable == 0 {
		return syscall.ForkExec(path, args, attr)
	}
	cleared := saved
	cleared[0].Inheritable, cleared[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &cleared[0]); err != nil {
		return 0, fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	pid, err := syscall.ForkExec(path, args, attr)
	if rerr := unix.Capset(&hdr, &saved[0]); rerr != nil {
		if err == nil {
			// Reaped with the orphans (shell.reap).
			unix.Kill(pid, unix.SIGKILL)
		}
		return 0, fmt.Errorf("restore inheritable capabilities: %w", rerr)
	}
	// Growing the set again made init non-dumpable (commit_creds does
	// that when capabilities are added). In user namespace mode init must
	// stay dumpable, or a restored one could never be checkpointed again
	// (setNonDumpable says why); in host mode it is non-dumpable anyway.
	if ownUserNS() {
		unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
	}
	return pid, err
}
