package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// TestServeSurvivesKill runs the real `arbor serve` (built from this tree)
// on a state dir of its own, makes two envs over the websocket, kills the
// server with SIGKILL and starts it again on the same state dir: the env
// whose state is intact comes back under its id at its last committed
// state (info.recovered on its first step, and in envs) and keeps its task
// (evaluate runs the task's verifier); the env whose process image was
// damaged while the server was down is reported lost (env_lost, infra);
// the envs the server had not handed out (the task's template and warm
// env) are closed. Then the recovered env's init is killed from the host:
// the next step answers sandbox_failed naming the state it was restored
// at, arbor_envs_revived_total counts it, and the env goes on.
func TestServeSurvivesKill(t *testing.T) {
	bin, dir, addr := serveRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	srv := startServe(t, bin, dir, addr)
	c := dialServe(t, ctx, addr, srv)
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	step(t, ctx, c, env, `export G=1 && printf '%s\n' "$GREETING" > greeting.txt`)
	st, err := c.States(ctx, env) // waits for the head's checkpoint to commit
	if err != nil {
		t.Fatal(err)
	}
	committed, turn := st.Head, st.States[len(st.States)-1].Turn
	// A second env whose newest process image is damaged while the
	// server is down: it cannot be restored.
	r2, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	doomed := r2.EnvID
	step(t, ctx, c, doomed, "echo x > /x")
	if _, err := c.States(ctx, doomed); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := srv.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	srv.Wait()
	damageNewestImage(t, dir)

	srv = startServe(t, bin, dir, addr)
	c = dialServe(t, ctx, addr, srv)
	defer c.Close()
	envs, err := c.Envs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(envs) != 2 {
		// The task's template and warm env of the first run come back
		// too, and are closed: the server had not handed them out.
		t.Errorf("envs after restart: %+v, want the two envs handed out", envs)
	}
	var got, lost *arbor.EnvInfo
	for i := range envs {
		switch envs[i].EnvID {
		case env:
			got = &envs[i]
		case doomed:
			lost = &envs[i]
		}
	}
	want := &arbor.Recovered{StateID: committed, Turn: turn}
	if got == nil || got.Recovered == nil || *got.Recovered != *want || got.Task != "hello" || got.Head != committed {
		t.Fatalf("envs after restart lists %+v for %s, want recovered %+v task hello", got, env, want)
	}
	if lost == nil || lost.Lost == "" {
		t.Errorf("envs after restart lists %+v for the damaged env %s, want it lost", lost, doomed)
	}
	s, err := c.Step(ctx, env, arbor.Bash("cat greeting.txt; echo $G; pwd", 0))
	if err != nil {
		t.Fatal(err)
	}
	if s.Obs.Stdout != "hello, arbor\n1\n/work/hello\n" || s.Info.Recovered == nil || *s.Info.Recovered != *want || s.Info.Turn != turn+1 {
		t.Errorf("first step after restart: %q, info %+v, want the committed state and recovered %+v", s.Obs.Stdout, s.Info, want)
	}
	s, err = c.Step(ctx, env, arbor.Bash("true", 0))
	if err != nil || s.Info.Recovered != nil {
		t.Errorf("second step after restart: %+v %v, want no recovered", s, err)
	}
	ev, err := c.Evaluate(ctx, env)
	if err != nil || ev.Reward != 1 {
		t.Errorf("evaluate after restart: %+v %v, want reward 1 from the task's verifier", ev, err)
	}
	// Its sandbox's init killed from the host: the next step answers
	// sandbox_failed naming the state it was restored to, the metric
	// counts it, and the step after runs on that state.
	st, err = c.States(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	step(t, ctx, c, env, "export G=gone")
	killInit(t, env+"-0") // the sandbox name a restart gives the env
	_, err = c.Step(ctx, env, arbor.Bash("echo never", 0))
	if !errors.Is(err, arbor.ErrSandbox) || !arbor.IsInfra(err) || !strings.Contains(err.Error(), "restored to state "+st.Head) {
		t.Errorf("step after its init was killed: %v, want sandbox_failed naming state %s", err, st.Head)
	}
	s, err = c.Step(ctx, env, arbor.Bash("cat greeting.txt; echo $G", 0))
	if err != nil || s.Obs.Stdout != "hello, arbor\n1\n" {
		t.Errorf("step after the revive: %+v %v, want the last committed state", s, err)
	}
	if m := metric(t, addr, "arbor_envs_revived_total"); m != "1" {
		t.Errorf("arbor_envs_revived_total = %q, want 1", m)
	}
	_, err = c.Step(ctx, doomed, arbor.Bash("true", 0))
	if !errors.Is(err, arbor.ErrEnvLost) || !arbor.IsInfra(err) {
		t.Errorf("step on the lost env: %v, want env_lost (infra)", err)
	}
	// close drops it; it is then unknown.
	if err := c.CloseEnv(ctx, doomed); err != nil {
		t.Errorf("close of the lost env: %v", err)
	}
	if _, err := c.Step(ctx, doomed, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("step on the lost env after close: %v, want unknown_env", err)
	}
	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
}

func step(t *testing.T, ctx context.Context, c *arbor.Client, env, cmd string) {
	t.Helper()
	s, err := c.Step(ctx, env, arbor.Bash(cmd, 0))
	if err != nil {
		t.Fatal(err)
	}
	if s.Obs.ExitCode != 0 {
		t.Fatalf("step %q: exit %d: %s", cmd, s.Obs.ExitCode, s.Obs.Stderr)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serveRig readies a run of the real arbor serve: the binary built from
// this tree, a state dir of its own (whatever the servers leave mounted
// below it is unmounted at the end) and a free loopback address. It skips
// where the server cannot run.
func serveRig(t *testing.T) (bin, dir, addr string) {
	t.Helper()
	sandboxtest.RequireRoot(t)
	if _, err := criu.New("", nil); errors.Is(err, cr.ErrUnavailable) {
		t.Skipf("criu 4.x not installed: run make deps (%v)", err)
	} else if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(t.TempDir(), "arbor")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build arbor: %v\n%s", err, out)
	}
	dir = t.TempDir()
	t.Cleanup(func() { unmountBelow(t, dir) })
	return bin, dir, freeAddr(t)
}

// startServe starts arbor serve with its log in the test's log; more are
// more flags of serve.
func startServe(t *testing.T, bin, dir, addr string, more ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--state-dir", dir, "serve", "--listen", addr, "--warm", "1", "--env-idle-ttl", "-1s",
		"--tasks", "", "--inspector", "off"}, more...)...)
	cmd.Dir = t.TempDir() // no ./tasks: the built-in hello task
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.Contains(l, "restor") || strings.Contains(l, "lost") || strings.Contains(l, "ERROR") {
				t.Log("serve: " + l)
			}
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// dialServe waits until the server answers (the first start builds the
// busybox image and prepares the task).
func dialServe(t *testing.T, ctx context.Context, addr string, srv *exec.Cmd) *arbor.Client {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		c, err := arbor.Dial(ctx, addr, nil)
		if err == nil {
			if _, err = c.Hello(ctx, ""); err == nil {
				return c
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("server on %s never answered: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// damageNewestImage truncates the image files of the newest process image
// (the last checkpoint's), so that CRIU cannot restore it.
func damageNewestImage(t *testing.T, dir string) {
	t.Helper()
	var dirs []string
	for _, d := range []string{"hot", "cold"} {
		ents, _ := os.ReadDir(filepath.Join(dir, "engine", "images", d))
		for _, e := range ents {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				dirs = append(dirs, filepath.Join(dir, "engine", "images", d, e.Name()))
			}
		}
	}
	mtime := func(p string) time.Time {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}
	sort.Slice(dirs, func(i, j int) bool { return mtime(dirs[i]).Before(mtime(dirs[j])) })
	if len(dirs) == 0 {
		t.Fatal("no process image on disk")
	}
	newest := dirs[len(dirs)-1]
	imgs, _ := filepath.Glob(filepath.Join(newest, "*.img"))
	if len(imgs) == 0 {
		t.Fatalf("no image files in %s", newest)
	}
	for _, f := range imgs {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// killInit kills (SIGKILL) the init of sandbox name: the one process of
// its cgroup whose parent is outside it.
func killInit(t *testing.T, name string) {
	t.Helper()
	v2 := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(v2, "cgroup.controllers")); err != nil {
		v2 = filepath.Join(v2, "unified") // a hybrid host
	}
	b, err := os.ReadFile(filepath.Join(v2, "arbor", name, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	pids := strings.Fields(string(b))
	for _, pid := range pids {
		st, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if pp, ok := strings.CutPrefix(l, "PPid:"); ok && !slices.Contains(pids, strings.TrimSpace(pp)) {
				var n int
				fmt.Sscan(pid, &n)
				if err := unix.Kill(n, unix.SIGKILL); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
	}
	t.Fatalf("no init among the processes %v of sandbox %s", pids, name)
}

// metric reads one sample of the server's /metrics.
func metric(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	return ""
}

// unmountBelow unmounts what the servers left mounted below dir (the
// btrfs pool, the hot image tmpfs), deepest first.
func unmountBelow(t *testing.T, dir string) {
	points := mountsBelow(t, dir)
	slices.Sort(points)
	slices.Reverse(points)
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Log(fmt.Sprintf("unmount %s: %v", p, err))
		}
	}
}
