package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/procfs"
)

// cgroupRoot is where the cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroup is one sandbox's control groups: on a hybrid host (this one) a
// directory in each v1 controller Arbor limits plus a node of the v2 tree
// (for freezing, killing and the cgroup id eBPF filters on); on a pure v2
// host just the v2 node, which then also carries the limits.
type cgroup struct {
	v1 map[string]string // controller -> directory
	v2 string
}

// v1Controllers are the v1 hierarchies a sandbox joins on a hybrid host;
// devices only when it is hardened.
var v1Controllers = []string{"memory", "pids", "cpu", "devices"}

// allowedDevices is the devices cgroup allow-list of a hardened sandbox,
// in devices.allow syntax (allowedDeviceRules is the same for eBPF): the nodes makeDev creates (null, zero, full,
// random, urandom, tty), ptmx and the sandbox's own pts. Everything else
// is denied, so a node made with CAP_MKNOD for a host disk cannot be
// opened (what Docker does with the same cgroup).
var allowedDevices = []string{
	"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm", "c 136:* rwm",
}

func unifiedRoot() (dir string, pure bool) {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return cgroupRoot, true
	}
	return filepath.Join(cgroupRoot, "unified"), false
}

// newCgroup creates the groups for name (e.g. "arbor/abc") and applies
// limits; devices adds the devices allow-list. On failure it removes what
// it made.
func newCgroup(name string, l Limits, devices bool) (cg *cgroup, err error) {
	v2root, pure := unifiedRoot()
	if _, err := os.Stat(filepath.Join(v2root, "cgroup.procs")); err != nil {
		return nil, fmt.Errorf("%w: cgroup v2 tree not found at %s", ErrUnsupported, v2root)
	}
	cg = &cgroup{v1: map[string]string{}, v2: filepath.Join(v2root, name)}
	defer func() {
		if err != nil {
			cg.remove()
		}
	}()
	if pure {
		enableControllers(v2root, name)
	}
	if err := os.MkdirAll(cg.v2, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", cg.v2, err)
	}
	// A group of this name left frozen by a server killed in a checkpoint
	// (its restart brings the env back under the same name) must not
	// freeze what joins it.
	writeFile(filepath.Join(cg.v2, "cgroup.freeze"), "0")
	if devices {
		// The eBPF allow-list works on every host with a v2 tree (the v1
		// devices controller, below, only on hybrid ones); on a hybrid
		// host either one refusing is enough.
		if err := attachDeviceFilter(cg.v2); err != nil {
			if _, serr := os.Stat(filepath.Join(cgroupRoot, "devices")); pure || serr != nil {
				return nil, err
			}
			slog.Debug("device filter not attached; the v1 devices cgroup enforces the allow-list", slog.Any("err", err))
		}
	}
	if pure {
		sets := map[string]string{"memory.max": strconv.FormatInt(l.MemoryBytes, 10), "memory.swap.max": "0", "pids.max": strconv.FormatInt(l.Pids, 10),
			"cpu.max": fmt.Sprintf("%d 100000", int64(l.CPUs*100000))}
		for f, v := range sets {
			if err := writeFile(filepath.Join(cg.v2, f), v); err != nil && f != "memory.swap.max" {
				return nil, err
			}
		}
		return cg, nil
	}
	for _, c := range v1Controllers {
		if c == "devices" && !devices {
			continue
		}
		if _, err := os.Stat(filepath.Join(cgroupRoot, c, "cgroup.procs")); c == "devices" && err != nil {
			continue // not mounted: the eBPF filter alone enforces the list
		}
		dir := filepath.Join(cgroupRoot, c, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		cg.v1[c] = dir
	}
	m := cg.v1["memory"]
	if err := writeFile(filepath.Join(m, "memory.limit_in_bytes"), strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(m, "memory.memsw.limit_in_bytes")); err == nil {
		if err := writeFile(filepath.Join(m, "memory.memsw.limit_in_bytes"), strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return nil, err
		}
	}
	if err := writeFile(filepath.Join(cg.v1["pids"], "pids.max"), strconv.FormatInt(l.Pids, 10)); err != nil {
		return nil, err
	}
	if d, ok := cg.v1["devices"]; ok {
		if err := writeFile(filepath.Join(d, "devices.deny"), "a"); err != nil {
			return nil, err
		}
		for _, a := range allowedDevices {
			if err := writeFile(filepath.Join(d, "devices.allow"), a); err != nil {
				return nil, err
			}
		}
	}
	if l.CPUs > 0 {
		if err := writeFile(filepath.Join(cg.v1["cpu"], "cpu.cfs_period_us"), "100000"); err != nil {
			return nil, err
		}
		if err := writeFile(filepath.Join(cg.v1["cpu"], "cpu.cfs_quota_us"), strconv.FormatInt(int64(l.CPUs*100000), 10)); err != nil {
			return nil, err
		}
	}
	return cg, nil
}

func enableControllers(root, name string) {
	dir := root
	for _, part := range strings.Split(filepath.Dir(name), "/") {
		writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+memory +pids +cpu")
		dir = filepath.Join(dir, part)
		os.MkdirAll(dir, 0o755)
	}
	writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+memory +pids +cpu")
}

func writeFile(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// dirs lists every directory of the group.
func (cg *cgroup) dirs() []string {
	d := []string{cg.v2}
	for _, c := range v1Controllers {
		if p, ok := cg.v1[c]; ok {
			d = append(d, p)
		}
	}
	return d
}

// add moves pid into every directory of the group.
func (cg *cgroup) add(pid int) error {
	for _, d := range cg.dirs() {
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// procs lists the host pids in the group.
func (cg *cgroup) procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(cg.v2, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup.procs: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// ID is the v2 cgroup id (the directory's inode number), what
// bpf_get_current_cgroup_id returns for tasks in the group.
func (cg *cgroup) ID() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(cg.v2, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", cg.v2, err)
	}
	return st.Ino, nil
}

// freezeWait bounds the wait for the kernel to report a group frozen or
// thawed: a few ms normally; a task the freezer cannot stop (one stuck in
// an uninterruptible wait) would otherwise hold the caller forever.
const freezeWait = 2 * time.Second

// freeze stops (or resumes) every task of the group and waits, at most
// freezeWait, until the kernel says the group is frozen (thawed). A freeze
// that does not complete is undone (the group is thawed again) before the
// error, wrapping ErrTimeout, is returned.
func (cg *cgroup) freeze(on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	if err := writeFile(filepath.Join(cg.v2, "cgroup.freeze"), v); err != nil {
		return err
	}
	want := "frozen " + v
	deadline := time.Now().Add(freezeWait)
	for {
		b, err := os.ReadFile(filepath.Join(cg.v2, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("read cgroup.events: %w", err)
		}
		if bytes.Contains(b, []byte(want)) {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Microsecond)
	}
	err := fmt.Errorf("cgroup %s: %w waiting %v for %q", cg.v2, ErrTimeout, freezeWait, want)
	if on {
		if terr := writeFile(filepath.Join(cg.v2, "cgroup.freeze"), "0"); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw after failed freeze: %w", terr))
		}
	}
	return err
}

// trapRounds bounds how often freezeNoTrap thaws the group to let a
// pending SIGTRAP be handled, and trapWait how long one such thaw lasts at
// most.
const (
	trapRounds = 10
	trapWait   = 50 * time.Millisecond
)

// freezeNoTrap freezes the group so that CRIU can dump it: compel refuses
// a thread with a pending SIGTRAP, and one sent to a process that catches
// it just before the freeze stays pending. A task found holding one gets
// the group thawed until that signal is handled (at most trapWait), then
// the group is frozen and checked again, at most trapRounds times. Init
// never holds one (initd ignoreSignals leaves SIGTRAP at SIG_DFL, which
// the kernel drops); a process of the agent's that blocks SIGTRAP and
// keeps it pending cannot be dumped (docs/sandbox.md, "What a checkpoint
// needs of the sandbox").
func (cg *cgroup) freezeNoTrap() error {
	for round := 0; ; round++ {
		if err := cg.freeze(true); err != nil {
			return err
		}
		tid, err := cg.pendingTrap()
		if err == nil && tid == 0 {
			return nil
		}
		if err == nil && round == trapRounds {
			err = fmt.Errorf("%w: cgroup %s: task %d keeps a SIGTRAP pending after %d thaws (blocked or sent again each time); CRIU cannot dump a thread with a pending SIGTRAP",
				ErrBroken, cg.v2, tid, trapRounds)
		}
		if terr := cg.freeze(false); terr != nil || err != nil {
			return errors.Join(err, terr)
		}
		for deadline := time.Now().Add(trapWait); time.Now().Before(deadline) && trapPending(tid); {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// pendingTrap returns a thread of the group with SIGTRAP pending (for the
// thread or its whole process), or 0.
func (cg *cgroup) pendingTrap() (int, error) {
	b, err := os.ReadFile(filepath.Join(cg.v2, "cgroup.threads"))
	if err != nil {
		return 0, fmt.Errorf("read cgroup.threads: %w", err)
	}
	for _, f := range strings.Fields(string(b)) {
		if tid, err := strconv.Atoi(f); err == nil && trapPending(tid) {
			return tid, nil
		}
	}
	return 0, nil
}

// trapPending reports whether /proc/TID/status shows SIGTRAP in the
// thread's (SigPnd) or its process's (ShdPnd) pending set. A thread gone
// has nothing pending.
func trapPending(tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return false
	}
	return sigPending(b, syscall.SIGTRAP)
}

// sigPending reports whether a status file's SigPnd or ShdPnd mask holds
// sig (signal n is bit n-1).
func sigPending(status []byte, sig syscall.Signal) bool {
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && m&(1<<(sig-1)) != 0 {
			return true
		}
	}
	return false
}

// kill sends SIGKILL to every task of the group.
func (cg *cgroup) kill() {
	if err := writeFile(filepath.Join(cg.v2, "cgroup.kill"), "1"); err == nil {
		return
	}
	pids, _ := cg.procs()
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
}

// remove kills what is left and deletes every directory, waiting for the
// tasks to be gone.
func (cg *cgroup) remove() error {
	var errs []error
	for _, d := range cg.dirs() {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			continue
		}
		var err error
		for i := 0; i < 400; i++ {
			if err = unix.Rmdir(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			if d == cg.v2 {
				cg.kill()
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// counters are the limit events seen so far.
type counters struct {
	pidsMax int64 // forks refused by pids.max
	oomKill int64 // tasks killed by the OOM killer
}

func (cg *cgroup) counters() counters {
	var c counters
	if d, ok := cg.v1["pids"]; ok {
		c.pidsMax = keyed(filepath.Join(d, "pids.events"), "max")
	} else {
		c.pidsMax = keyed(filepath.Join(cg.v2, "pids.events"), "max")
	}
	if d, ok := cg.v1["memory"]; ok {
		c.oomKill = keyed(filepath.Join(d, "memory.oom_control"), "oom_kill")
	} else {
		c.oomKill = keyed(filepath.Join(cg.v2, "memory.events"), "oom_kill")
	}
	return c
}

// memory is what the group's memory controller charges now, and of that
// its anonymous (process-private) part.
func (cg *cgroup) memory() (Memory, error) {
	var m Memory
	cur, stat, anon := filepath.Join(cg.v2, "memory.current"), filepath.Join(cg.v2, "memory.stat"), "anon"
	if d, ok := cg.v1["memory"]; ok {
		cur, stat, anon = filepath.Join(d, "memory.usage_in_bytes"), filepath.Join(d, "memory.stat"), "rss"
	}
	b, err := os.ReadFile(cur)
	if err != nil {
		return m, fmt.Errorf("read memory usage: %w", err)
	}
	if m.Current, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return m, fmt.Errorf("read memory usage: %w", err)
	}
	m.Anon = keyed(stat, anon)
	return m, nil
}

// keyed reads "key value" lines and returns value for key (0 if absent).
func keyed(path, key string) int64 {
	b, err := procfs.ReadFile(path) // after every command (docs/inspector.md, "Cost")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// RemoveStaleCgroups deletes the cgroups of sandboxes that no longer have
// processes (left by a server that was killed): every empty directory below
// arbor/ in each hierarchy Arbor uses that is older than a minute (a younger
// one may belong to a sandbox another process is starting right now).
// Groups with processes are kept. It returns how many it removed.
func RemoveStaleCgroups() int {
	v2root, _ := unifiedRoot()
	roots := []string{filepath.Join(v2root, "arbor")}
	for _, c := range v1Controllers {
		roots = append(roots, filepath.Join(cgroupRoot, c, "arbor"))
	}
	n := 0
	for _, r := range roots {
		ents, err := os.ReadDir(r)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
				continue
			}
			if unix.Rmdir(filepath.Join(r, e.Name())) == nil {
				n++
			}
		}
	}
	return n
}
