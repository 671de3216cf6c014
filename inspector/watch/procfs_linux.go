package watch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/internal/procfs"
)

// sampleProcs samples every process of scan s except the sandbox's init
// (pid 1 inside) and the managed shell (shellNS, its pid inside): those
// two cost their status line alone (docs/inspector.md, "Cost"). returns
// gives eBPF return counts when available. A scan past its budget is an
// error: the sample would not describe every process.
func sampleProcs(s *scan, shellNS int, returns func(tgid uint32) (uint64, bool)) ([]inspector.ProcSample, error) {
	if s.err != nil {
		return nil, s.err
	}
	var out []inspector.ProcSample
	for _, sp := range s.procs {
		if sp.ns == 0 || sp.ns == 1 || (shellNS > 0 && sp.ns == shellNS) {
			continue // gone meanwhile, init, or the shell
		}
		p, ok := sampleProc(s, sp)
		if !ok {
			continue
		}
		if returns != nil {
			p.Returns, p.HasReturns = returns(uint32(sp.pid))
		}
		out = append(out, p)
	}
	if s.over != "" {
		return nil, errors.New(s.over)
	}
	return out, nil
}

// sampleProc reads the process sample of sp.
func sampleProc(s *scan, sp *scanned) (p inspector.ProcSample, ok bool) {
	pid := sp.pid
	dir := fmt.Sprintf("/proc/%d", pid)
	pending := sp.pending
	stat, err := procfs.ReadFile(dir + "/stat")
	if err != nil {
		return p, false
	}
	// comm may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	j := bytes.IndexByte(stat, '(')
	if i < 0 || j < 0 {
		return p, false
	}
	p.PID = pid
	p.Comm = string(stat[j+1 : i])
	fs := strings.Fields(string(stat[i+1:]))
	if len(fs) < 20 {
		return p, false
	}
	p.Zombie = fs[0] == "Z" || fs[0] == "X"
	p.Start, _ = strconv.ParseUint(fs[19], 10, 64)
	p.Pending = pending
	// T: stopped by a signal; t (tracing stop) and a frozen cgroup
	// (which shows the state the task had) are not.
	p.Stopped = fs[0] == "T"
	p.Attrs = inspector.ProcAttrs(pid)
	tasks, _ := procfs.ReadDirNames(dir + "/task")
	p.Threads = len(tasks)
	for _, t := range tasks {
		td := dir + "/task/" + t
		if b, err := procfs.ReadFile(td + "/schedstat"); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				ns, _ := strconv.ParseInt(f[0], 10, 64)
				p.Runtime += time.Duration(ns)
			}
		}
		if st, err := procfs.ReadFile(td + "/status"); err == nil {
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "SigPnd:"); ok && strings.Trim(v, "\t 0") != "" {
					p.Pending += " " + t + ":" + strings.TrimSpace(v)
				}
			}
		}
		// "running", or -1 (no syscall: stopped in user mode), means it
		// will execute user code again without a syscall returning.
		if b, err := procfs.ReadFile(td + "/syscall"); err == nil {
			if strings.HasPrefix(string(b), "running") || strings.HasPrefix(string(b), "-1 ") {
				p.Running = true
			}
		}
	}
	p.SharedWritable = sharedWritable(s.mapsOf(sp))
	return p, true
}

// sharedWritable lists the files a maps file b maps shared and writable.
func sharedWritable(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || len(fs[1]) < 4 || fs[1][1] != 'w' || fs[1][3] != 's' {
			continue
		}
		name := strings.Join(fs[5:], " ")
		if !strings.HasPrefix(name, "/") || strings.HasSuffix(name, "(deleted)") ||
			strings.HasPrefix(name, "/memfd:") || strings.HasPrefix(name, "/SYSV") || strings.HasPrefix(name, "/dev/") {
			continue
		}
		out = append(out, name)
	}
	return out
}

// heldFacts turns each changed file that a process of the sandbox holds
// open, maps or has as its cwd into a fact that the processes changed
// too. CRIU records the path and size of every file an image has open or
// mapped and refuses to restore the image next to a different one ("File
// ... has bad size", or a missing file), so a file snapshot with that file
// changed cannot pair with the last process image: the turn needs both
// (issue 13's skip fuzzer found it: `exec 4<f`, then `: > f` classified
// fs, and the branch failed to restore).
//
// A held file is matched by any of its names: the changed path as written
// (`..` cleaned), as resolved inside root (a symlinked parent), a changed
// directory above it (a renamed or removed directory moves or drops what
// is held below it), and its inode (a hard link changed by its other
// name).
//
// same are the paths written this turn that compared unchanged. One that
// exists neither live nor in the snapshot (a scratch file made and
// removed) is unaccounted when a process still holds that removed file:
// the writes went to a file no path names, whose contents a restore brings
// back from the image's ghost or from another name that links it, which
// the event does not say (the skip fuzzer found `exec 3>>t; ln t u; rm t;
// echo w >&3` classified proc).
func heldFacts(s *scan, root string, facts []inspector.Fact, same []string) []inspector.Fact {
	root = filepath.Clean(root)
	changed := map[string]bool{}
	type devIno struct{ dev, ino uint64 }
	inodes := map[devIno]bool{}
	inos := map[uint64]bool{} // maps name a file's inode with the device of its superblock, not stat's
	for _, f := range facts {
		if f.Kind != inspector.FileChanged || f.Path == "" {
			continue
		}
		changed[path.Clean("/"+f.Path)] = true
		host, missing, err := inspector.ResolveIn(root, f.Path)
		if err != nil || missing {
			continue
		}
		if root != "/" {
			changed[path.Clean("/"+strings.TrimPrefix(host, root))] = true
		}
		var st unix.Stat_t
		if unix.Lstat(host, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			inodes[devIno{st.Dev, st.Ino}] = true
			inos[st.Ino] = true
		}
	}
	gone := map[string]bool{}
	for _, p := range same {
		var st unix.Stat_t
		if host, missing, err := inspector.ResolveIn(root, p); err == nil && !missing && unix.Lstat(host, &st) == nil {
			continue
		}
		gone[path.Clean("/"+p)] = true
	}
	if len(changed) == 0 && len(gone) == 0 {
		return nil
	}
	if s.err != nil {
		return []inspector.Fact{{Kind: inspector.Unaccounted, Detail: fmt.Sprintf("list processes for their open files: %v", s.err)}}
	}
	inSandbox := func(p string) string {
		p = strings.TrimSuffix(p, " (deleted)")
		if root != "" && root != "/" && (p == root || strings.HasPrefix(p, root+"/")) {
			p = "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		}
		return path.Clean(p)
	}
	// covered reports whether p or a directory above it changed.
	covered := func(p string) bool {
		for ; ; p = path.Dir(p) {
			if changed[p] {
				return true
			}
			if p == "/" || p == "." {
				return false
			}
		}
	}
	var out []inspector.Fact
	seen := map[string]bool{}
	hold := func(pid int, p, how string, byInode bool) {
		if p = inSandbox(p); (byInode || covered(p)) && !seen[p] {
			seen[p] = true
			out = append(out, inspector.Fact{Kind: inspector.ProcRan, PID: pid,
				Detail: fmt.Sprintf("%s changed while process %d %s (its image records the file)", p, pid, how)})
		}
	}
	statIn := func(p string) bool {
		var st unix.Stat_t
		return len(inodes) > 0 && unix.Stat(p, &st) == nil && inodes[devIno{st.Dev, st.Ino}]
	}
	for _, sp := range s.procs {
		pid := sp.pid
		if t, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
			hold(pid, t, "has it as its cwd", false)
		}
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		for _, fe := range s.fdsOf(sp) {
			t, e := fe.link, strconv.Itoa(fe.fd)
			if !strings.HasPrefix(t, "/") {
				continue
			}
			p, deleted := inSandbox(t), strings.HasSuffix(t, " (deleted)")
			if deleted && gone[p] {
				return []inspector.Fact{{Kind: inspector.Unaccounted, Detail: fmt.Sprintf("%s was written and removed while process %d holds it", p, pid)}}
			}
			if len(changed) == 0 {
				continue
			}
			hold(pid, t, "holds it open", statIn(dir+"/"+e))
			// A removed file still linked at another path is restored
			// through that path, which the image does not name (a link
			// remap, docs/inspector.md), and one no path links through
			// the image's copy: any file change may be the removal or
			// rename of a name that links it, which its path does not
			// show, so the image is taken again.
			var st unix.Stat_t
			if deleted && !seen[p] && unix.Stat(dir+"/"+e, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				seen[p] = true
				out = append(out, inspector.Fact{Kind: inspector.ProcRan, PID: pid,
					Detail: fmt.Sprintf("files changed while process %d holds the removed file %s", pid, p)})
			}
		}
		if len(changed) == 0 {
			continue
		}
		if m := s.mapsOf(sp); m != nil {
			for _, line := range strings.Split(string(m), "\n") {
				if fs := strings.Fields(line); len(fs) >= 6 && strings.HasPrefix(fs[5], "/") {
					ino, _ := strconv.ParseUint(fs[4], 10, 64)
					hold(pid, strings.Join(fs[5:], " "), "maps it", ino != 0 && inos[ino])
				}
			}
		}
	}
	return append(out, s.overFact()...)
}
