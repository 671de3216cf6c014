package criu

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/arbor-env/arbor/cr"
)

// agentDumpError is the error of a failed dump whose log in dir blames the
// sandbox's own state (agentstate.go), wrapping cr.ErrAgentState; nil
// when it does not.
func agentDumpError(dir string, limit int64) error {
	b, err := os.ReadFile(filepath.Join(dir, "dump.log"))
	if err != nil {
		return nil
	}
	g, ok := parseGhostFailure(b)
	if !ok {
		return nil
	}
	who := ""
	if g.pid > 0 {
		who = fmt.Sprintf(" (pid %d", sandboxPID(g.pid))
		if fds := heldBy(g.pid, g.path); len(fds) > 0 {
			who += ", fd " + strings.Join(fds, ", ")
		}
		who += ")"
	}
	return fmt.Errorf("%w: the sandbox holds a deleted file of %s open, %s%s, over the %s limit on such files (close it, or keep its name, before the turn ends)",
		cr.ErrAgentState, mib(g.size), g.path, who, mib(limit))
}

// agentRestoreError is the error of a failed restore whose log in dir
// blames the sandbox's own state, wrapping cr.ErrAgentState; nil when it
// does not.
func agentRestoreError(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "restore.log"))
	switch {
	case err != nil:
		return nil
	case quotaInRestore(b):
		return fmt.Errorf("%w: the restore could not write the sandbox's held deleted files back under its own disk quota", cr.ErrAgentState)
	case ghostPathBlocked(b):
		return fmt.Errorf("%w: a process holds a deleted file whose directory the sandbox replaced by a file, so the file cannot be put back where it was named (keep the directory while the file is held, or close it)", cr.ErrAgentState)
	}
	return nil
}

// sandboxPID is host pid p's pid in its innermost pid namespace (the
// sandbox's), or p when that is unknown.
func sandboxPID(p int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p))
	if err != nil {
		return p
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "NSpid:"); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				return p
			}
			if n, err := strconv.Atoi(fs[len(fs)-1]); err == nil {
				return n
			}
		}
	}
	return p
}

// heldBy lists the descriptors of host pid p that hold the deleted file
// at path (as the sandbox names it).
func heldBy(p int, path string) []string {
	dir := fmt.Sprintf("/proc/%d/fd", p)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var fds []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == path+" (deleted)" {
			fds = append(fds, e.Name())
		}
	}
	return fds
}
