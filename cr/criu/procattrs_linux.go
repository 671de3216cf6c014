package criu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/state"
)

// hostTask is one task of a tree: its host ids and the ids it has in the
// tree's own pid namespace.
type hostTask struct {
	tid, pid     int // host
	nsTID, nsPID int // the sandbox's
	status       string
}

// treeTasks lists every task (each thread) of the tree rooted at the host
// pid root. A task that exits during the walk is left out.
func treeTasks(root int) ([]hostTask, error) {
	var out []hostTask
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if gone(err) && pid != root {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list tasks of pid %d: %w", pid, err)
		}
		nsPID := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			dir := fmt.Sprintf("/proc/%d/task/%d", pid, tid)
			status, nsTID, err := nsID(dir)
			if gone(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if tid == pid {
				nsPID = nsTID
			}
			out = append(out, hostTask{tid: tid, pid: pid, nsTID: nsTID, status: status})
			kids, err := os.ReadFile(dir + "/children")
			if gone(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("read children of task %d: %w", tid, err)
			}
			for _, f := range strings.Fields(string(kids)) {
				if k, err := strconv.Atoi(f); err == nil {
					queue = append(queue, k)
				}
			}
		}
		for i := range out {
			if out[i].pid == pid {
				out[i].nsPID = nsPID
			}
		}
	}
	return out, nil
}

// nsID reads the status of the task whose /proc directory is dir and
// its innermost id (the last of NSpid).
func nsID(dir string) (string, int, error) {
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return "", 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				id, err := strconv.Atoi(f[len(f)-1])
				return string(b), id, err
			}
		}
	}
	return "", 0, fmt.Errorf("%s/status: no NSpid", dir)
}

// gone: err says the task exited.
func gone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)
}

// readAttrs reads t's attributes; those of its status, which nothing
// sets from outside, as the walk that found t read them.
func readAttrs(t hostTask) (taskAttrs, error) {
	a := taskAttrs{TID: t.nsTID, PID: t.nsPID}
	var err error
	if a.Affinity, err = affinity(t.tid); err != nil {
		return a, err
	}
	prio, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(t.tid), 0)
	if errno != 0 {
		return a, fmt.Errorf("read I/O priority of task %d: %w", t.tid, errno)
	}
	a.IOPrio = int(prio)
	proc := fmt.Sprintf("/proc/%d/", t.tid) // a thread's own, also when not listed
	b, err := os.ReadFile(proc + "timerslack_ns")
	if err != nil {
		return a, fmt.Errorf("read timer slack of task %d: %w", t.tid, err)
	}
	if a.TimerSlack, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return a, fmt.Errorf("read timer slack of task %d: %w", t.tid, err)
	}
	a.Fixed = fixedLines(nil, t.status)
	if t.tid != t.pid {
		return a, nil
	}
	b, err = os.ReadFile(proc + "ksm_stat")
	if err != nil && !errors.Is(err, os.ErrNotExist) { // a kernel without KSM has none
		return a, fmt.Errorf("read ksm_stat of pid %d: %w", t.pid, err)
	}
	a.Fixed = fixedLines(a.Fixed, string(b))
	if b, err = os.ReadFile(proc + "coredump_filter"); err != nil {
		return a, fmt.Errorf("read coredump_filter of pid %d: %w", t.pid, err)
	}
	if s := strings.TrimSpace(string(b)); s != "" { // a zombie has no memory, and no filter
		f, err := strconv.ParseUint(s, 16, 32)
		if err != nil {
			return a, fmt.Errorf("read coredump_filter of pid %d: %w", t.pid, err)
		}
		f32 := uint32(f)
		a.CoredumpFilter = &f32
	}
	b, err = os.ReadFile(proc + "autogroup")
	if errors.Is(err, os.ErrNotExist) {
		return a, nil // a kernel without autogroups
	}
	if err != nil {
		return a, fmt.Errorf("read autogroup of pid %d: %w", t.pid, err)
	}
	nice, err := parseAutogroup(string(b))
	if err != nil {
		return a, fmt.Errorf("read autogroup of pid %d: %w", t.pid, err)
	}
	a.AutogroupNice = &nice
	return a, nil
}

// affinity lists the CPUs task tid (0: this thread) may run on.
func affinity(tid int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return nil, fmt.Errorf("read CPU affinity of task %d: %w", tid, err)
	}
	var cpus []int
	for cpu := 0; cpu < len(set)*64; cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, nil
}

// recordAttrs writes attrsFile into dir for tasks, a tree's. The tree
// should be frozen (the engine's is), or what it records may be older
// than the dump.
func recordAttrs(dir string, tasks []hostTask) error {
	own, err := affinity(0) // what CRIU, so the tree, starts with
	if err != nil {
		return err
	}
	var rec attrsRecord
	for _, t := range tasks {
		a, err := readAttrs(t)
		if gone(err) {
			continue
		}
		if err != nil {
			return err
		}
		if slices.Equal(a.Affinity, own) {
			a.Affinity = nil
		}
		rec.Tasks = append(rec.Tasks, a)
	}
	b, err := encodeAttrs(rec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, attrsFile), b, 0o644); err != nil {
		return fmt.Errorf("record task attributes: %w", err)
	}
	return nil
}

// applyAttrs gives the tree restored from dir, rooted at the host pid
// root and not yet running (CRIU's post-restore), the attributes recorded
// at its dump that Arbor sets. One that does not come out as recorded (a
// CPU the host or the cgroup does not allow) fails it with
// state.ErrUnrestorableState, naming the task and the attribute: never a
// copy that differs.
func applyAttrs(dir string, root int) error {
	return eachRecorded(dir, root, func(t hostTask, want, got taskAttrs) ([]string, error) {
		if len(settableDiffs(want, got)) == 0 {
			return nil, nil
		}
		// Each attribute that differs is set, then everything read
		// back: what the kernel refused or narrowed shows there.
		serr := setAttrs(t, want, got)
		got, err := readAttrs(t)
		if err != nil {
			return nil, err
		}
		d := settableDiffs(want, got)
		if len(d) > 0 && serr != nil {
			d = append(d, serr.Error())
		}
		return d, nil
	})
}

// checkFixed fails, with state.ErrUnrestorableState, a restored tree
// whose fields that nothing sets from outside (speculation control, ...)
// differ from the record. It runs once CRIU is done: CRIU restores
// seccomp filters, which may force a speculation mitigation, after its
// post-restore, and the tree is not handed out before.
func checkFixed(dir string, root int) error {
	return eachRecorded(dir, root, func(_ hostTask, want, got taskAttrs) ([]string, error) {
		return fixedDiffs(want, got), nil
	})
}

// eachRecorded calls f with each task of the tree rooted at the host pid
// root that the record in dir lists, the record and what the task has
// now; f returns what still differs, which fails the restore with
// state.ErrUnrestorableState. Images without a record pass.
func eachRecorded(dir string, root int, f func(t hostTask, want, got taskAttrs) ([]string, error)) error {
	b, err := os.ReadFile(filepath.Join(dir, attrsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil // an image older than the record
	}
	if err != nil {
		return fmt.Errorf("read task attributes: %w", err)
	}
	rec, err := decodeAttrs(b)
	if err != nil {
		return err
	}
	tasks, err := treeTasks(root)
	if err != nil {
		return err
	}
	byNS := make(map[int]hostTask, len(tasks))
	for _, t := range tasks {
		byNS[t.nsTID] = t
	}
	for _, want := range rec.Tasks {
		t, ok := byNS[want.TID]
		if !ok && !want.settable() {
			// Seen in the cluster tests' migrations (a restored task
			// the walk does not find under its number, unexplained
			// yet): a task with nothing to give back loses nothing.
			continue
		}
		if !ok {
			found := make([]int, 0, len(tasks))
			for _, t := range tasks {
				found = append(found, t.nsTID)
			}
			recorded := make([]int, 0, len(rec.Tasks))
			for _, t := range rec.Tasks {
				recorded = append(recorded, t.TID)
			}
			return fmt.Errorf("apply task attributes: task %d is not in the restored tree (root pid %d, tasks %v, recorded %v, image %s)", want.TID, root, found, recorded, imagePids(dir))
		}
		got, err := readAttrs(t)
		if gone(err) {
			// It exited (checkFixed runs once the tree runs: a
			// short-lived child ends on its own); nothing of it to
			// compare.
			continue
		}
		if err != nil {
			return err
		}
		d, err := f(t, want, got)
		if gone(err) {
			continue
		}
		if err != nil {
			return err
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", t.pid, t.tid)); len(d) > 0 && gone(err) {
			continue // it exited while it was read
		}
		if len(d) > 0 {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", t.tid))
			return fmt.Errorf("%w: task %d of process %d (%s): %s cannot be given back after the restore",
				state.ErrUnrestorableState, want.TID, want.PID, strings.TrimSpace(string(comm)), strings.Join(d, "; "))
		}
	}
	return nil
}

// setAttrs sets on t those of want's attributes that differ from got.
func setAttrs(t hostTask, want, got taskAttrs) error {
	var errs []string
	if !slices.Equal(want.Affinity, got.Affinity) {
		var set unix.CPUSet
		for _, cpu := range want.Affinity {
			if cpu >= 0 && cpu < len(set)*64 {
				set.Set(cpu)
			}
		}
		if err := unix.SchedSetaffinity(t.tid, &set); err != nil {
			errs = append(errs, fmt.Sprintf("set CPU affinity: %v", err))
		}
	}
	if want.IOPrio != got.IOPrio {
		if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(t.tid), uintptr(want.IOPrio)); errno != 0 {
			errs = append(errs, fmt.Sprintf("set I/O priority: %v", errno))
		}
	}
	proc := fmt.Sprintf("/proc/%d/", t.tid)
	if want.TimerSlack != got.TimerSlack {
		if err := os.WriteFile(proc+"timerslack_ns", []byte(strconv.FormatUint(want.TimerSlack, 10)), 0); err != nil {
			errs = append(errs, fmt.Sprintf("set timer slack: %v", err))
		}
	}
	if want.CoredumpFilter != nil && (got.CoredumpFilter == nil || *got.CoredumpFilter != *want.CoredumpFilter) {
		if err := os.WriteFile(proc+"coredump_filter", []byte(fmt.Sprintf("%#x", *want.CoredumpFilter)), 0); err != nil {
			errs = append(errs, fmt.Sprintf("set coredump_filter: %v", err))
		}
	}
	if want.AutogroupNice != nil && (got.AutogroupNice == nil || *got.AutogroupNice != *want.AutogroupNice) {
		if err := os.WriteFile(proc+"autogroup", []byte(strconv.Itoa(*want.AutogroupNice)), 0); err != nil {
			errs = append(errs, fmt.Sprintf("set autogroup nice: %v", err))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// imagePids lists the pids and threads of the pstree image in dir, for an
// error message.
func imagePids(dir string) string {
	f, err := os.Open(filepath.Join(dir, "pstree.img"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(&pstree.PstreeEntry{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range img.Entries {
		p := e.Message.(*pstree.PstreeEntry)
		fmt.Fprintf(&b, "%d%v ", p.GetPid(), p.GetThreads())
	}
	return b.String()
}
