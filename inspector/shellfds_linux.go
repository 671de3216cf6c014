package inspector

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbor-env/arbor/internal/procfs"
	"github.com/arbor-env/arbor/sandbox"
)

// ReadShell reads the state of t's managed shell: ShellQuery's output (run
// in the shell) and the shell's open file descriptors (read from /proc on
// the host, FDTable), digested together. It is the one way the inspector,
// its baseline and --verify-skips read a shell, so that all three compare
// the same things.
func ReadShell(ctx context.Context, t Target) (ShellState, error) {
	if t.Shell == nil {
		return ShellState{}, fmt.Errorf("no shell given")
	}
	r, err := t.Shell.Exec(ctx, ShellQuery, sandbox.ExecOptions{Timeout: 10 * time.Second, MaxOutput: 8 << 20, NoLimitCheck: true})
	if err != nil {
		return ShellState{}, fmt.Errorf("read shell state: %w", err)
	}
	if r.Truncated || r.ShellRestarted {
		return ShellState{}, fmt.Errorf("state query output truncated or shell restarted")
	}
	st := NormalizeShellState(r.Stdout)
	fds, err := FDTable(t.Cgroup, st.PID, t.LiveRoot)
	if err != nil {
		return ShellState{}, fmt.Errorf("read the shell's descriptors: %w", err)
	}
	st.FDs = fds
	h := sha256.New()
	h.Write([]byte(st.Digest))
	h.Write([]byte{0})
	h.Write([]byte(fds))
	st.Digest = hex.EncodeToString(h.Sum(nil))
	return st, nil
}

// oLargefile is the kernel's O_LARGEFILE on x86_64 (x/sys/unix defines it
// as 0 there, as user space never needs to pass it).
const oLargefile = 0o100000

// oCloexec is close-on-exec as fdinfo shows it (O_CLOEXEC).
const oCloexec = 0o2000000

// kernelObject returns the kind of kernel object a /proc/PID/fd name
// that is not a path names, "pipe" of "pipe:[1234]" and "socket" of
// "socket:[99]" (the form ^[a-z_]+:\[[0-9]+\]$), and ok false for any
// other name ("anon_inode:[eventfd]" too). The inode number is dropped: a
// restore makes new pipes and sockets. A scan, not a regexp: it runs for
// every descriptor of every turn (docs/inspector.md, "Cost").
func kernelObject(name string) (kind string, ok bool) {
	kind, num, ok := strings.Cut(name, ":[")
	if !ok || kind == "" || len(num) < 2 || num[len(num)-1] != ']' {
		return "", false
	}
	for _, c := range kind {
		if (c < 'a' || c > 'z') && c != '_' {
			return "", false
		}
	}
	for _, c := range num[:len(num)-1] {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return kind, true
}

// FDTable lists the open file descriptors of the process whose pid in the
// sandbox is nsPID (in the sandbox whose v2 cgroup is cgroup and whose root
// is root on the host): one line per descriptor with its number, what it
// refers to (a path inside the sandbox, or the kind of kernel object), its
// open flags, for a file its offset, and the locks on it: what a CRIU
// restore brings back for each descriptor and a program can observe (`exec
// 3>>log`, `exec 4<file; read -u 4`, `flock 9` in a child). It ends with
// the process's ProcAttrs (limits, nice, oom_score_adj), which its children
// can change without it running.
func FDTable(cgroup string, nsPID int, root string) (string, error) {
	host, err := hostPID(cgroup, nsPID)
	if err != nil {
		return "", err
	}
	if err := atPrompt(host); err != nil {
		return "", err
	}
	dir := fmt.Sprintf("/proc/%d/fd", host)
	ents, err := procfs.ReadDirNamesMax(dir, MaxShellFDs)
	if err != nil {
		return "", err
	}
	fds := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e); err == nil {
			fds = append(fds, n)
		}
	}
	slices.Sort(fds)
	root = filepath.Clean(root)
	var b strings.Builder
	for _, n := range fds {
		target, err := os.Readlink(fmt.Sprintf("%s/%d", dir, n))
		if err != nil {
			continue // closed meanwhile
		}
		file := true
		switch kind, ok := kernelObject(target); {
		case ok:
			target, file = kind, false
		case strings.HasPrefix(target, "anon_inode:"):
			file = false
		case root != "" && root != "/" && (target == root || strings.HasPrefix(target, root+"/")):
			target = "/" + strings.TrimPrefix(strings.TrimPrefix(target, root), "/")
		}
		// CRIU restores a descriptor of a deleted file through a link it
		// makes and removes, NAME.cr_link: the same file.
		if t, ok := strings.CutSuffix(target, ".cr_link (deleted)"); ok {
			target = t + " (deleted)"
		}
		flags, pos, locks := fdInfo(fmt.Sprintf("/proc/%d/fdinfo/%d", host, n))
		// O_LARGEFILE: CRIU opens the terminal it restores with it, and on
		// x86_64 every open has it in effect; no program can tell.
		if v, err := strconv.ParseUint(flags, 8, 64); err == nil {
			v &^= oLargefile
			if strings.HasPrefix(target, "/dev/pts/") {
				// The shell's terminal: CRIU does not bring back its
				// close-on-exec bit, and commands never get it (their
				// stdin is /dev/null).
				v &^= oCloexec
			}
			flags = strconv.FormatUint(v, 8)
		}
		if !file {
			pos = "" // pipes and sockets have no offset of their own
		}
		fmt.Fprintf(&b, "%d %q flags=%s pos=%s", n, target, flags, pos)
		if locks != "" {
			fmt.Fprintf(&b, " locks=%s", locks)
		}
		b.WriteByte('\n')
	}
	b.WriteString(ProcAttrs(host))
	return b.String(), nil
}

// MaxShellFDs bounds the descriptors of the shell FDTable reads: a shell
// holding more is not read (its state is unknown, and the turn dumps it),
// so an agent's `ulimit -n` and a million descriptors cost the server a
// bounded read per turn (docs/inspector.md, "Cost").
const MaxShellFDs = 4096

// promptWait bounds how long FDTable waits for the shell to be back at its
// prompt.
const promptWait = 2 * time.Second

// atPrompt waits until the shell (host pid) is blocked reading its terminal
// (read on fd 0: /proc/PID/syscall starts "0 0x0 "), its prompt. The status
// record of a command reaches init while the shell still runs the rest of
// the line: the printf's own redirection has moved fd 1 aside into a saved
// copy for a moment, and a table read then differs from the one at rest
// (seen as a flaky "shell state changed" in the turn suite).
func atPrompt(pid int) error {
	deadline := time.Now().Add(promptWait)
	for {
		b, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
		if err != nil {
			return err
		}
		if bytes.HasPrefix(b, []byte("0 0x0 ")) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the shell is not back at its prompt after %v (syscall %q)", promptWait, bytes.TrimSpace(b))
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// fdInfo reads the flags and pos lines of an fdinfo file, and its lock
// lines (flock and POSIX locks on the open file, which a child holding the
// same open file can take or drop while the holder sleeps, and CRIU
// restores) without their index, owner pid and device:inode.
func fdInfo(p string) (flags, pos, locks string) {
	b, err := procfs.ReadFile(p)
	if err != nil {
		return "?", "?", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch k {
		case "flags":
			flags = strings.TrimSpace(v)
		case "pos":
			pos = strings.TrimSpace(v)
		case "lock":
			// "1: FLOCK  ADVISORY  WRITE 16656 fe:00:9977927 0 EOF"
			if f := strings.Fields(v); len(f) >= 8 {
				locks += " " + strings.Join(append(f[1:4:4], f[6:]...), ",")
			} else {
				locks += " " + strings.Join(f, ",")
			}
		}
	}
	return flags, pos, locks
}

// ProcAttrs reads, from the host, what another process can change in
// process pid without pid running and a restore brings back: its resource
// limits, soft and hard (prlimit), its nice value (setpriority, renice)
// and its oom_score_adj.
func ProcAttrs(pid int) string {
	var b strings.Builder
	if l, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/limits", pid)); err == nil {
		b.Write(l)
	} else {
		fmt.Fprintf(&b, "limits: %v\n", err)
	}
	if st, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// Fields after the command's closing parenthesis: state is the
		// first (field 3), nice the 17th (field 19).
		if i := bytes.LastIndexByte(st, ')'); i >= 0 {
			if f := strings.Fields(string(st[i+1:])); len(f) > 16 {
				fmt.Fprintf(&b, "nice %s\n", f[16])
			}
		}
	}
	if o, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); err == nil {
		fmt.Fprintf(&b, "oom_score_adj %s", o)
	}
	return b.String()
}

// hostPID finds the host pid of the process of cgroup whose pid in the
// sandbox's namespace is nsPID.
func hostPID(cgroup string, nsPID int) (int, error) {
	if nsPID <= 0 {
		return 0, fmt.Errorf("no shell pid")
	}
	b, err := procfs.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		st, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if fs := strings.Fields(v); len(fs) > 0 && fs[len(fs)-1] == strconv.Itoa(nsPID) {
					return pid, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no process %d in %s", nsPID, cgroup)
}
