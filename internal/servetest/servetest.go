// Package servetest runs the real `arbor serve` as a subprocess for tests
// that need the whole server (crash and restart, a clean stop, load): the
// binary, a free loopback address, the process with its log, and the
// host-side clean-up of what a server leaves mounted or running.
package servetest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// RequireHost skips where the real server cannot run (not root, no CRIU
// 4.x: what make deps installs) and fails on any other CRIU error.
func RequireHost(tb testing.TB) {
	tb.Helper()
	sandboxtest.CRIU(tb, nil)
}

// Bin is $ARBOR_BIN (make test passes bin/arbor), else arbor built from
// this tree into a temporary folder.
func Bin(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("ARBOR_BIN"); p != "" {
		return p
	}
	bin := filepath.Join(tb.TempDir(), "arbor")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/arbor-env/arbor/cmd/arbor").CombinedOutput(); err != nil {
		tb.Fatalf("build arbor: %v\n%s", err, out)
	}
	return bin
}

// FreeAddr is a loopback address no one listens on now.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Options says how to start a server.
type Options struct {
	Bin      string   // default Bin(tb)
	StateDir string   // --state-dir; default a temporary folder
	Dir      string   // working directory; default a temporary folder (no ./tasks)
	Addr     string   // --listen; default FreeAddr(tb)
	Global   []string // flags before the serve command (--log-level warn)
	Args     []string // flags of serve after --listen
	// OnLine gets every line the server writes (stdout and stderr).
	OnLine func(string)
}

// Server is one `arbor serve` subprocess. Exited is closed once it has
// exited, with WaitErr set.
type Server struct {
	Cmd      *exec.Cmd
	Addr     string
	StateDir string
	Exited   chan struct{}
	WaitErr  error

	mu   sync.Mutex
	tail []string
}

// Start starts `arbor [Global] --state-dir DIR serve --listen ADDR [Args]`.
// At the end of the test it is killed if still running, and whatever is
// mounted below its state dir is unmounted.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	if o.Bin == "" {
		o.Bin = Bin(tb)
	}
	if o.StateDir == "" {
		o.StateDir = tb.TempDir()
	}
	if o.Dir == "" {
		o.Dir = tb.TempDir()
	}
	if o.Addr == "" {
		o.Addr = FreeAddr(tb)
	}
	args := append(slices.Clone(o.Global), "--state-dir", o.StateDir, "serve", "--listen", o.Addr)
	s := &Server{Cmd: exec.Command(o.Bin, append(args, o.Args...)...), Addr: o.Addr, StateDir: o.StateDir, Exited: make(chan struct{})}
	s.Cmd.Dir = o.Dir
	s.Cmd.Env = os.Environ()
	if os.Getenv("ARBOR_INIT") == "" {
		s.Cmd.Env = append(s.Cmd.Env, "ARBOR_INIT="+sandboxtest.InitBinary(tb))
	}
	out, err := s.Cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	s.Cmd.Stdout = s.Cmd.Stderr
	if err := s.Cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			s.mu.Lock()
			s.tail = append(s.tail, l)
			if len(s.tail) > 200 {
				s.tail = s.tail[len(s.tail)-100:]
			}
			s.mu.Unlock()
			if o.OnLine != nil {
				o.OnLine(l)
			}
		}
		s.WaitErr = s.Cmd.Wait()
		close(s.Exited)
	}()
	tb.Cleanup(func() {
		s.Kill()
		// What a stopped server left mounted (checked, and reported, by
		// the test that stopped it) must not stay on the host: the zfs
		// backend's own pool is exported (the daemon unmounts it), the
		// rest unmounted.
		ExportZFSBelow(tb, o.StateDir)
		UnmountBelow(tb, o.StateDir)
	})
	return s
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.Cmd.Process.Pid }

// Tail is the last lines the server wrote.
func (s *Server) Tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.tail, "\n")
}

// Dial waits (at most timeout: the first start builds the busybox image
// and prepares the tasks) until the server answers hello and returns a
// client connected to it. It fails the test when the server exits first.
func (s *Server) Dial(tb testing.TB, ctx context.Context, timeout time.Duration) *arbor.Client {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := arbor.Dial(dctx, s.Addr, nil)
		if err == nil {
			if _, err = c.Hello(dctx, ""); err == nil {
				cancel()
				return c
			}
			c.Close()
		}
		cancel()
		select {
		case <-s.Exited:
			tb.Fatalf("arbor serve exited: %v\n%s", s.WaitErr, s.Tail())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			tb.Fatalf("server on %s never answered: %v", s.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop sends SIGTERM and waits (at most timeout) for the server to exit;
// it kills it after that and says so.
func (s *Server) Stop(timeout time.Duration) error {
	s.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.Exited:
		return s.WaitErr
	case <-time.After(timeout):
		s.Kill()
		return fmt.Errorf("arbor serve did not stop within %s of SIGTERM", timeout)
	}
}

// Kill kills the server (SIGKILL) unless it has exited, and waits for it.
func (s *Server) Kill() {
	select {
	case <-s.Exited:
	default:
		s.Cmd.Process.Kill()
		<-s.Exited
	}
}

// Metrics reads the server's /metrics samples, keyed by name, with
// its labels as /metrics writes them when it has any
// (arbor_requests_total{code="ok",method="step"}).
func (s *Server) Metrics() (map[string]float64, error) {
	resp, err := http.Get("http://" + s.Addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		i := strings.LastIndexByte(l, ' ')
		if i < 0 || strings.HasPrefix(l, "#") {
			continue
		}
		name, v := l[:i], l[i+1:]
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			m[name] = f
		}
	}
	return m, sc.Err()
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct{ Dev, Point, FSType, Source string }

// MountsBelow lists the mounts of this mount namespace (the server's too)
// at or below dir.
func MountsBelow(dir string) []Mount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var ms []Mount
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 9 || (f[4] != dir && !strings.HasPrefix(f[4], dir+"/")) {
			continue
		}
		i := slices.Index(f, "-")
		if i < 0 || i+1 >= len(f) {
			continue
		}
		m := Mount{Dev: f[2], Point: f[4], FSType: f[i+1]}
		if i+2 < len(f) {
			m.Source = f[i+2]
		}
		ms = append(ms, m)
	}
	return ms
}

// ExportZFSBelow exports the ZFS pools with datasets mounted below dir
// (the zfs backend's own pool, left imported by a server that was
// killed): unmounting them behind the ZFS daemon's back would leave the
// pool imported in it.
func ExportZFSBelow(tb testing.TB, dir string) {
	pools := map[string]bool{}
	for _, m := range MountsBelow(dir) {
		if m.FSType == "zfs" || m.FSType == "fuse.zfs" {
			pools[strings.SplitN(m.Source, "/", 2)[0]] = true
		}
	}
	for p := range pools {
		if out, err := exec.Command("zpool", "export", "-f", p).CombinedOutput(); err != nil {
			tb.Errorf("export zfs pool %s left imported below %s: %v: %s", p, dir, err, out)
		}
	}
}

// UnmountBelow unmounts what is mounted below dir (the btrfs pool, the
// hot image tmpfs), deepest first.
func UnmountBelow(tb testing.TB, dir string) {
	var points []string
	for _, m := range MountsBelow(dir) {
		points = append(points, m.Point)
	}
	slices.Sort(points)
	slices.Reverse(points)
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			tb.Logf("unmount %s: %v", p, err)
		}
	}
}

// CgroupV2 is the folder of the sandboxes' v2 cgroups (docs/sandbox.md):
// below the unified node on a hybrid host.
func CgroupV2() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup/arbor"
	}
	return "/sys/fs/cgroup/unified/arbor"
}

// KillInit kills (SIGKILL) the init of the sandbox of env: the process of
// its live cgroup (arbor/ENV or arbor/ENV-N) whose parent is outside it.
// It reports false when the env has no live sandbox.
func KillInit(env string) (bool, error) {
	dirs, _ := filepath.Glob(filepath.Join(CgroupV2(), env+"*"))
	for _, dir := range dirs {
		if name := filepath.Base(dir); name != env && !strings.HasPrefix(name, env+"-") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		var pids []int
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				pids = append(pids, p)
			}
		}
		for _, pid := range pids {
			if pp := ppid(pid); pp > 0 && !slices.Contains(pids, pp) {
				return true, unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	return false, nil
}

// ppid is the parent of pid from /proc/PID/stat (0 when gone).
func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}
