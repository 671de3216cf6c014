package benchmarks

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/arbor-env/arbor/sandbox"
)

// StateDigest is what the recovery check compares: the file tree, the
// managed shell's state and the long-lived processes with their in-memory
// state, each digested separately so a mismatch says which part differs.
type StateDigest struct {
	Files string `json:"files"`
	Shell string `json:"shell"`
	Procs string `json:"procs"`
	// Procs in words: command lines and the memory probes' contents.
	ProcList []string `json:"proc_list,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
}

// Diff names the parts of d that differ from ref.
func (d StateDigest) Diff(ref StateDigest) []string {
	var out []string
	if d.Files != ref.Files {
		out = append(out, "files")
	}
	if d.Shell != ref.Shell {
		out = append(out, "shell")
	}
	if d.Procs != ref.Procs {
		out = append(out, "procs")
	}
	return out
}

// shellProbe prints the shell's state with builtins only (so it neither
// forks nor changes anything): cwd, exported variables, functions and
// aliases.
const shellProbe = `printf 'cwd=%s\n' "$PWD"; export -p; declare -f; alias`

// memProbeDir holds, per process that publishes in-memory state, a file
// named by its pid with "ADDRESS LENGTH" (see traces/counter_server.py).
const memProbeDir = "var/tmp/memprobe"

// probe digests the state of a live sandbox. It reads the file tree and
// the processes' memory from the host (they do not run for it) and asks
// the shell for its state with builtins.
func probe(ctx context.Context, sb *sandbox.Sandbox) (StateDigest, error) {
	var d StateDigest
	res, err := sb.Exec(ctx, shellProbe, sandbox.ExecOptions{Timeout: 20 * time.Second, MaxOutput: 4 << 20})
	if err != nil {
		return d, fmt.Errorf("probe shell: %w", err)
	}
	var shell []string
	for _, l := range strings.Split(string(res.Stdout), "\n") {
		if strings.HasPrefix(l, "declare -x _=") {
			continue
		}
		if c, ok := strings.CutPrefix(l, "cwd="); ok {
			d.Cwd = c
		}
		shell = append(shell, l)
	}
	d.Shell = digest(strings.Join(shell, "\n"))
	root := sb.Root()
	if d.Files, err = treeDigest(root); err != nil {
		return d, err
	}
	if d.ProcList, err = procState(root, sb.FreezerCgroup(), sb.InitPID()); err != nil {
		return d, err
	}
	d.Procs = digest(strings.Join(d.ProcList, "\n"))
	return d, nil
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

// skipDirs are not part of the file tree: virtual file systems, and the
// memory probes' own files (their addresses change with ASLR, which would
// fail a replay for the benchmark's plumbing, not for the agent's state).
var skipDirs = map[string]bool{"/proc": true, "/sys": true, "/dev": true, "/" + memProbeDir: true}

// metadataOnly are system trees the traces do not write; their files are
// digested by type, mode, owner and size (not content) to keep a digest
// of the whole root under 100 ms.
var metadataOnly = []string{"/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/var/lib/dpkg/", "/var/cache/", "/var/lib/apt/"}

// treeDigest digests a root: every path with its type, mode, owner, size,
// symlink target and (outside metadataOnly) content. Modification times
// are left out: they are not part of the state an agent relies on, and a
// replay could not reproduce them. Compiled Python files embed their
// source's mtime, so they count by size.
func treeDigest(root string) (string, error) {
	h := sha256.New()
	buf := make([]byte, 64<<10)
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		if de.IsDir() && skipDirs[rel] {
			fmt.Fprintf(h, "%s skipped\n", rel)
			return filepath.SkipDir
		}
		fi, err := de.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		if st != nil {
			uid, gid = st.Uid, st.Gid
		}
		fmt.Fprintf(h, "%s %o %d:%d", rel, uint32(fi.Mode()), uid, gid)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			fmt.Fprintf(h, " -> %s", t)
		case fi.Mode().IsRegular():
			fmt.Fprintf(h, " %d", fi.Size())
			if !hasAnyPrefix(rel, metadataOnly) && !strings.HasSuffix(rel, ".pyc") {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				fh := sha256.New()
				_, err = io.CopyBuffer(fh, f, buf)
				f.Close()
				if err != nil {
					return err
				}
				fmt.Fprintf(h, " %x", fh.Sum(nil)[:8])
			}
		}
		h.Write([]byte{'\n'})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digest file tree %s: %w", root, err)
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// procState lists the sandbox's long-lived processes (all but init and
// the managed shell, which the shell digest covers) by command line, and
// the in-memory state of those that publish it, read through
// /proc/PID/mem.
func procState(root, cgroupDir string, initPID int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(cgroupDir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("list sandbox processes: %w", err)
	}
	nsToHost := map[int]int{}
	var out []string
	for _, f := range strings.Fields(string(b)) {
		hp, err := strconv.Atoi(f)
		if err != nil || hp == initPID {
			continue
		}
		ns := nsPID(hp)
		nsToHost[ns] = hp
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hp))
		if err != nil {
			continue // gone
		}
		args := strings.TrimRight(strings.ReplaceAll(string(cmd), "\x00", " "), " ")
		if isShell(args) && parentIsInit(hp, initPID) {
			continue
		}
		out = append(out, "proc "+args)
	}
	ents, _ := os.ReadDir(filepath.Join(root, memProbeDir))
	for _, e := range ents {
		ns, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		line := "mem " + e.Name() + " " + readMem(root, e.Name(), nsToHost[ns])
		out = append(out, line)
	}
	sort.Strings(out)
	return out, nil
}

func isShell(args string) bool {
	f := strings.Fields(args)
	return len(f) > 0 && (filepath.Base(f[0]) == "bash" || filepath.Base(f[0]) == "sh")
}

// parentIsInit: the managed shell is init's child; a `bash -c` the agent
// started in the background is the shell's.
func parentIsInit(hp, initPID int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", hp))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(s[i+1:])
	return len(f) > 1 && f[1] == strconv.Itoa(initPID)
}

// nsPID is the pid of host pid hp in its innermost pid namespace.
func nsPID(hp int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", hp))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

// readMem reads the buffer a process published, or says why it cannot.
func readMem(root, name string, hp int) string {
	if hp == 0 {
		return "process missing"
	}
	b, err := os.ReadFile(filepath.Join(root, memProbeDir, name))
	if err != nil {
		return "no probe file"
	}
	var addr, n int64
	if _, err := fmt.Sscanf(string(b), "%d %d", &addr, &n); err != nil || n <= 0 || n > 4096 {
		return "bad probe file"
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", hp))
	if err != nil {
		return "cannot open memory"
	}
	defer f.Close()
	mem := make([]byte, n)
	if _, err := f.ReadAt(mem, addr); err != nil {
		return "cannot read memory"
	}
	if i := bytes.IndexByte(mem, 0); i >= 0 {
		mem = mem[:i]
	}
	return string(mem)
}
