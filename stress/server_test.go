package stress

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/internal/servetest"
)

// server is one `arbor serve` subprocess on a state dir of its own.
type server struct {
	*servetest.Server
	t       testing.TB
	pid     int
	addr    string
	dir     string // --state-dir
	poolDev string // major:minor of the btrfs pool below dir
	log     *lineLog
}

// lineLog keeps the server's WARN and ERROR lines for the report.
type lineLog struct {
	mu     sync.Mutex
	warns  []string
	errors []string
}

func (l *lineLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case strings.Contains(s, "level=ERROR"):
		l.errors = append(l.errors, s)
	case strings.Contains(s, "level=WARN"):
		l.warns = append(l.warns, s)
	}
}

func (l *lineLog) counts() (warns, errs []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.warns), slices.Clone(l.errors)
}

// requireHost skips where the real server cannot run.
func requireHost(t testing.TB) { servetest.RequireHost(t) }

// startServer starts arbor serve with the hello task (busybox, with a
// verifier) and waits until it answers hello. extra are more serve flags.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	return startServerWith(t, nil, extra...)
}

// startServerWith is startServer with global flags (before serve) added
// to --log-level warn.
func startServerWith(t testing.TB, global []string, extra ...string) *server {
	t.Helper()
	dir := t.TempDir()
	tasks := filepath.Join(dir, "tasks")
	if err := os.MkdirAll(tasks, 0o755); err != nil {
		t.Fatal(err)
	}
	task, err := os.ReadFile("../tasks/hello.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tasks, "hello.yaml"), task, 0o644); err != nil {
		t.Fatal(err)
	}
	log := &lineLog{}
	srv := servetest.Start(t, servetest.Options{
		StateDir: filepath.Join(dir, "state"), Dir: dir, Global: append([]string{"--log-level", "warn"}, global...),
		Args:   append([]string{"--warm", "1", "--env-idle-ttl", "-1s", "--tasks", tasks}, extra...),
		OnLine: log.add,
	})
	s := &server{Server: srv, t: t, pid: srv.Pid(), addr: srv.Addr, dir: srv.StateDir, log: log}
	srv.Dial(t, context.Background(), 3*time.Minute).Close() // the first start builds the busybox image
	for _, m := range servetest.MountsBelow(s.dir) {
		if m.FSType == "btrfs" {
			s.poolDev = m.Dev
		}
	}
	if s.poolDev == "" {
		t.Fatalf("no btrfs pool mounted below %s", s.dir)
	}
	return s
}

// stop sends SIGTERM and waits for the server to exit.
func (s *server) stop(timeout time.Duration) error { return s.Stop(timeout) }

// cgroup hierarchies a sandbox's groups live in (docs/sandbox.md): the v2
// node and, on a hybrid host, the v1 controllers.
func cgroupRoots() (v2 string, all []string) {
	v2 = servetest.CgroupV2()
	all = []string{v2}
	for _, c := range []string{"memory", "pids", "cpu", "devices"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "arbor")); err == nil {
			all = append(all, filepath.Join("/sys/fs/cgroup", c, "arbor"))
		}
	}
	return v2, all
}

func readPids(path string) []int {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// rootDev is the device (major:minor) of process pid's root mount.
func rootDev(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return ""
	}
	dev := ""
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "/" {
			dev = f[2] // the last mount on / is the root
		}
	}
	return dev
}

// cgroups tells which sandbox cgroups (arbor/NAME, shared by every server
// on the host) belong to this server: those whose processes have their
// root on its btrfs pool. It remembers every name it has seen, so a
// group left behind empty is found too.
type cgroups struct {
	s    *server
	mu   sync.Mutex
	seen map[string]bool // names of the server's groups seen with processes
}

func newCgroups(s *server) *cgroups { return &cgroups{s: s, seen: map[string]bool{}} }

// sandbox is one live sandbox cgroup of the server.
type sandbox struct {
	name   string
	pids   []int
	frozen bool
}

// scan lists the server's live sandbox cgroups and records their names.
func (g *cgroups) scan() map[string]sandbox {
	v2, _ := cgroupRoots()
	ents, _ := os.ReadDir(v2)
	live := map[string]sandbox{}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		// Only a verdict of ours is kept: a process CRIU is restoring
		// has not its root on the pool yet.
		pids := readPids(filepath.Join(v2, name, "cgroup.procs"))
		if len(pids) == 0 {
			continue
		}
		ours, determined := false, false
		for _, p := range pids {
			if d := rootDev(p); d != "" {
				ours, determined = d == g.s.poolDev, true
				break
			}
		}
		if !determined || !ours {
			continue // its processes exited while we looked, or not ours
		}
		g.seen[name] = true
		fz, _ := os.ReadFile(filepath.Join(v2, name, "cgroup.freeze"))
		live[name] = sandbox{name: name, pids: pids, frozen: strings.TrimSpace(string(fz)) == "1"}
	}
	return live
}

// leftover lists the directories, in every hierarchy, of groups of the
// server that are not in live.
func (g *cgroups) leftover(live map[string]sandbox) []string {
	_, roots := cgroupRoots()
	g.mu.Lock()
	defer g.mu.Unlock()
	var left []string
	for name := range g.seen {
		if _, ok := live[name]; ok {
			continue
		}
		for _, r := range roots {
			if _, err := os.Stat(filepath.Join(r, name)); err == nil {
				left = append(left, filepath.Join(r, name))
			}
		}
	}
	sort.Strings(left)
	return left
}

// watch scans every interval until ctx ends, so that short-lived groups
// are seen.
func (g *cgroups) watch(ctx context.Context, interval time.Duration) {
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			g.scan()
		}
	}
}

// snapshot is what a leak check compares.
type snapshot struct {
	fds, threads, goroutines int
	conns, inFlight          int   // arbor_connections, arbor_requests_in_flight
	rss                      int64 // bytes
	mounts                   []string
	sandboxes                int            // live sandbox cgroups of the server
	procs                    int            // processes in them
	children                 map[string]int // the server's child processes by command name
	zombies                  int            // of those, not reaped
}

func (s *server) snapshot(g *cgroups) (snapshot, error) {
	var sn snapshot
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid))
	if err != nil {
		return sn, err
	}
	sn.fds = len(fds)
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return sn, err
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			sn.threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			sn.rss = kb << 10
		}
	}
	// The server has no pprof endpoint (and gets none for this test):
	// its goroutine count comes from the Go collector of /metrics.
	m, err := s.Metrics()
	if err != nil {
		return sn, fmt.Errorf("read metrics: %w", err)
	}
	sn.goroutines = int(m["go_goroutines"])
	sn.conns, sn.inFlight = int(m["arbor_connections"]), int(m["arbor_requests_in_flight"])
	for _, mt := range servetest.MountsBelow(s.dir) {
		sn.mounts = append(sn.mounts, mt.Point)
	}
	sort.Strings(sn.mounts)
	live := g.scan()
	sn.sandboxes = len(live)
	for _, sb := range live {
		sn.procs += len(sb.pids)
	}
	sn.children = map[string]int{}
	for _, pid := range childrenOf(s.pid) {
		comm, state := procStat(pid)
		sn.children[comm]++
		if state == "Z" {
			sn.zombies++
		}
	}
	return sn, nil
}

// childrenOf lists the processes whose parent is pid (any of its
// threads).
func childrenOf(pid int) []int {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err == nil && len(tasks) > 0 {
		var out []int
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil {
					out = append(out, n)
				}
			}
		}
		return out
	}
	// Kernels without CONFIG_PROC_CHILDREN: walk /proc.
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		if err != nil {
			continue
		}
		if f := statFields(st); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// procStat is a process's command name and state letter.
func procStat(pid int) (comm, state string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "?", "?"
	}
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return "?", "?"
	}
	comm = string(b[i+1 : j])
	if f := statFields(b); len(f) > 0 {
		state = f[0]
	}
	return comm, state
}

// statFields are the fields of /proc/PID/stat after the command name:
// state, ppid, ...
func statFields(b []byte) []string {
	j := bytes.LastIndexByte(b, ')')
	if j < 0 {
		return nil
	}
	return strings.Fields(string(b[j+1:]))
}
