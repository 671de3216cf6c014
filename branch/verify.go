package branch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// Verification is what Verify found.
type Verification struct {
	State string
	// Misses lists every difference between the live environment and a
	// restore of State: a change the checkpoint (or its absence) missed.
	Misses []string
	Took   time.Duration
}

// Verify restores state sid (which env's current state should equal: its
// head after a turn classified none, fs or proc) and compares it with the
// live environment: the file tree, the shell's state digest and the set of
// processes (pid and command line; restored pids are the original ones).
// In-memory contents of background processes are not compared. This is the
// check behind --verify-skips; it costs a restore.
func (e *Engine) Verify(ctx context.Context, env *Env, sid string) (Verification, error) {
	start := time.Now()
	v := Verification{State: sid}
	env.mu.Lock()
	defer env.mu.Unlock()
	if _, err := env.gate(ctx); err != nil {
		return v, err
	}
	if env.ckptErr != nil {
		return v, env.ckptErr
	}
	e.gcMu.RLock()
	r, err := e.restore(ctx, sid, state.NewID("verify-"))
	e.gcMu.RUnlock()
	if err != nil {
		return v, err
	}
	defer func() {
		r.sb.Destroy(context.Background())
		e.o.Snap.Destroy(context.Background(), r.volume)
	}()
	diffs, err := inspector.TreeDiff(ctx, e.o.Snap.Path(env.volume), e.o.Snap.Path(r.volume))
	if err != nil {
		return v, fmt.Errorf("compare trees: %w", err)
	}
	for _, d := range diffs {
		v.Misses = append(v.Misses, "file "+d)
	}
	live, err := readShell(ctx, env.sb)
	if err != nil {
		return v, err
	}
	restored, err := readShell(ctx, r.sb)
	if err != nil {
		return v, err
	}
	switch {
	case live.FDs != restored.FDs:
		v.Misses = append(v.Misses, fmt.Sprintf("shell descriptors differ: live %q, restored %q", live.FDs, restored.FDs))
	case live.Digest != restored.Digest:
		v.Misses = append(v.Misses, "shell state differs")
	}
	lp, rp := processSet(env.sb.FreezerCgroup()), processSet(r.sb.FreezerCgroup())
	for _, p := range lp {
		if !slices.Contains(rp, p) {
			v.Misses = append(v.Misses, "process missing after restore: "+p)
		}
	}
	for _, p := range rp {
		if !slices.Contains(lp, p) {
			v.Misses = append(v.Misses, "process not live: "+p)
		}
	}
	v.Took = time.Since(start)
	e.stats.verified.Add(1)
	if len(v.Misses) > 0 {
		e.stats.misses.Add(1)
	}
	return v, nil
}

// readShell reads a sandbox's shell state as the inspector does.
func readShell(ctx context.Context, sb *sandbox.Sandbox) (inspector.ShellState, error) {
	return inspector.ReadShell(ctx, inspector.Target{Shell: sb, Cgroup: sb.FreezerCgroup(), LiveRoot: sb.Root()})
}

// processSet lists "nspid cmdline" of every live process in a cgroup.
func processSet(cgroupDir string) []string {
	b, _ := os.ReadFile(filepath.Join(cgroupDir, "cgroup.procs"))
	var out []string
	for _, f := range strings.Fields(string(b)) {
		cmd, err := os.ReadFile(filepath.Join("/proc", f, "cmdline"))
		if err != nil || len(cmd) == 0 {
			continue // exited, or a zombie
		}
		st, _ := os.ReadFile(filepath.Join("/proc", f, "status"))
		ns := ""
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				fs := strings.Fields(v)
				ns = fs[len(fs)-1]
			}
		}
		out = append(out, ns+" "+strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " "))
	}
	slices.Sort(out)
	return out
}
