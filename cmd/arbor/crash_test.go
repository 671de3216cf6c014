package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
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
	servetest.RequireHost(t)
	serveSurvivesKill(t, t.TempDir(), nil)
}

// TestServeSurvivesKillZFS is TestServeSurvivesKill on `arbor --backend
// zfs serve` with its own pool: after the kill -9 the pool is still
// imported (and zfs-fuse running), and the restart reuses both.
func TestServeSurvivesKillZFS(t *testing.T) {
	dir := requireZFS(t)
	serveSurvivesKill(t, dir, zfsGlobal)
}

// serveSurvivesKill is TestServeSurvivesKill with global flags before
// serve (the backend).
func serveSurvivesKill(t *testing.T, dir string, global []string) {
	addr := servetest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	startServe := func(t *testing.T, ctx context.Context, dir, addr string, more ...string) (*servetest.Server, *arbor.Client) {
		return startServeOn(t, ctx, global, dir, addr, more...)
	}

	srv, c := startServe(t, ctx, dir, addr)
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
	srv.Kill()
	damageNewestImage(t, dir)

	srv, c = startServe(t, ctx, dir, addr)
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
	// env-0: the sandbox name a restart gives the env.
	if ok, err := servetest.KillInit(env + "-0"); !ok || err != nil {
		t.Fatalf("kill the init of %s-0: found %v, %v", env, ok, err)
	}
	_, err = c.Step(ctx, env, arbor.Bash("echo never", 0))
	if !errors.Is(err, arbor.ErrSandbox) || !arbor.IsInfra(err) || !strings.Contains(err.Error(), "restored to state "+st.Head) {
		t.Errorf("step after its init was killed: %v, want sandbox_failed naming state %s", err, st.Head)
	}
	s, err = c.Step(ctx, env, arbor.Bash("cat greeting.txt; echo $G", 0))
	if err != nil || s.Obs.Stdout != "hello, arbor\n1\n" {
		t.Errorf("step after the revive: %+v %v, want the last committed state", s, err)
	}
	if m, err := srv.Metrics(); err != nil || m["arbor_envs_revived_total"] != 1 {
		t.Errorf("arbor_envs_revived_total = %v (%v), want 1", m["arbor_envs_revived_total"], err)
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
	if err := srv.Stop(time.Minute); err != nil {
		t.Errorf("stop: %v", err)
	}
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

// startServe starts the real arbor serve (the binary make test built from this
// tree) on state dir dir and address addr, with the built-in hello task and
// the notable lines of its log in the test's log, and waits until it
// answers (the first start builds the busybox image and prepares the
// task); more are more flags of serve.
func startServe(t *testing.T, ctx context.Context, dir, addr string, more ...string) (*servetest.Server, *arbor.Client) {
	t.Helper()
	return startServeOn(t, ctx, nil, dir, addr, more...)
}

// startServeOn is startServe with global flags before serve (the backend).
func startServeOn(t *testing.T, ctx context.Context, global []string, dir, addr string, more ...string) (*servetest.Server, *arbor.Client) {
	t.Helper()
	srv := servetest.Start(t, servetest.Options{StateDir: dir, Addr: addr, Global: global,
		Args: append([]string{"--warm", "1", "--env-idle-ttl", "-1s", "--tasks", "", "--inspector", "off"}, more...),
		OnLine: func(l string) {
			if strings.Contains(l, "restor") || strings.Contains(l, "lost") || strings.Contains(l, "ERROR") {
				t.Log("serve: " + l)
			}
		}})
	return srv, srv.Dial(t, ctx, 3*time.Minute)
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
