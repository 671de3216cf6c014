package branch_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// crashAtEnv names the checkpoint phase at which the recovery helper
// SIGKILLs itself ("lost": at the intent of an env's first checkpoint).
const crashAtEnv = "ARBOR_CRASH_AT"

// The env the helper leaves: files, a shell variable and a process whose
// memory holds a counter (counterCmd) describe each turn; the turn-two
// state is the last one committed.
const (
	recoverTurn1 = "mkdir -p /work && cd /work && export V=one && echo one > /work/f"
	recoverTurn2 = "export V=two && echo two > /work/f"
	recoverTurn3 = "export V=three && echo three > /work/f"
)

// TestRecoverAfterCrash kills (SIGKILL, from a checkpoint hook, so at a
// chosen phase) a process whose env has a committed state and a
// checkpoint in progress, reopens the engine on its state dir, and checks
// that the env is back under its id at the committed state: files, shell
// variable and a process's memory; that what the interrupted checkpoint
// wrote is gone; and that the env steps, checkpoints and branches. An env
// whose first checkpoint never committed is reported lost.
func TestRecoverAfterCrash(t *testing.T) {
	if os.Getenv(crashAtEnv) != "" {
		recoverHelper(t)
		return
	}
	requireCR(t)
	for _, phase := range []string{"intent", "dump", "commit", "lost"} {
		t.Run(phase, func(t *testing.T) {
			dir := t.TempDir()
			snap := newBtrfs(t, dir) // mounted here so the helper reuses it
			out := runRecoverHelper(t, dir, phase)
			t.Logf("helper announced %v", out)
			r := newRig(t, snap, dir, 0) // reopens the engine: recovery runs
			e := r.e
			envID := out["ENV"][0]
			if phase == "lost" {
				checkLost(t, e, envID)
				// Still reported by the next run, until forgotten.
				if err := e.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				e = newRig(t, snap, dir, 0).e
				checkLost(t, e, envID)
				if err := e.ForgetLost(context.Background(), envID); err != nil {
					t.Fatal(err)
				}
				if _, err := e.Env(envID); !errors.Is(err, state.ErrUnknownEnv) || len(e.Lost()) != 0 {
					t.Errorf("after ForgetLost: Env = %v, Lost = %+v; want unknown and none", err, e.Lost())
				}
				return
			}
			committed, turn := out["COMMITTED"][0], out["COMMITTED"][1]
			env, err := e.Env(envID)
			if err != nil {
				t.Fatalf("env %s not back after the crash: %v (lost: %+v)", envID, err, e.Lost())
			}
			rec := env.Recovered()
			if rec == nil || rec.State != committed || fmt.Sprint(rec.Turn) != turn || env.Head() != committed {
				t.Fatalf("recovered %+v head %s, want state %s turn %s", rec, env.Head(), committed, turn)
			}
			if got := env.Labels()["owner"]; got != "helper" {
				t.Errorf("label owner = %q after recovery, want helper", got)
			}
			if got := run(t, e, env, "cat /work/f; echo $V; pwd"); got != "two\ntwo\n/work\n" {
				t.Errorf("files, variable, cwd after recovery: %q, want the turn-two state", got)
			}
			_, read := counterCmd("busybox")
			if got := strings.TrimSpace(run(t, e, env, read)); got != "3" {
				t.Errorf("counter process answered %s, want 3 (2 in memory at the committed state)", got)
			}
			checkHalfWrittenGone(t, r, out["MADE"])
			// It goes on: a step, a checkpoint, a branch of it.
			run(t, e, env, "echo four > /work/f")
			sid, err := e.Checkpoint(context.Background(), env, state.Full)
			if err != nil {
				t.Fatal(err)
			}
			res, err := e.Branch(context.Background(), branch.Source{State: sid}, 1)
			if err != nil || res.Errors[0] != nil {
				t.Fatalf("branch of the recovered env: %v %v", err, res.Errors)
			}
			if got := run(t, e, res.Children[0], "cat /work/f; echo $V; "+read); got != "four\ntwo\n4\n" {
				t.Errorf("branch child of the recovered env: %q", got)
			}
		})
	}
}

func checkLost(t *testing.T, e *branch.Engine, envID string) {
	t.Helper()
	_, err := e.Env(envID)
	if !errors.Is(err, state.ErrLost) {
		t.Fatalf("Env(%s) = %v, want state.ErrLost", envID, err)
	}
	lost := e.Lost()
	if len(lost) != 1 || lost[0].ID != envID || lost[0].Err == nil || lost[0].Labels["owner"] != "helper" {
		t.Fatalf("Lost() = %+v, want env %s with its error and labels", lost, envID)
	}
	if !strings.Contains(err.Error(), lost[0].Err.Error()) {
		t.Errorf("state.ErrLost %q does not say why (%v)", err, lost[0].Err)
	}
	for _, env := range e.Envs() {
		if env.ID == envID {
			t.Errorf("lost env %s is listed open", envID)
		}
	}
}

// checkHalfWrittenGone: nothing of what the interrupted checkpoint wrote
// (lines "MADE kind location") is left on disk or in the manifest.
func checkHalfWrittenGone(t *testing.T, r *rig, made []string) {
	t.Helper()
	u, err := r.e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Manifest.Intents != 0 {
		t.Errorf("%d intents left after recovery", u.Manifest.Intents)
	}
	if len(made) == 0 {
		t.Fatal("the helper reported no artifact of the interrupted checkpoint")
	}
	for i := 0; i+1 < len(made); i += 2 {
		kind, loc := made[i], made[i+1]
		switch manifest.ArtifactKind(kind) {
		case manifest.ArtifactFS:
			vols, err := r.snap.List(context.Background(), loc)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vols {
				if v.Name == loc {
					t.Errorf("half-written snapshot %s left", loc)
				}
			}
		case manifest.ArtifactProc:
			for _, d := range []string{"hot", "cold"} {
				if _, err := os.Stat(filepath.Join(r.opts.StateDir, "images", d, loc)); err == nil {
					t.Errorf("half-written process image %s/%s left", d, loc)
				}
			}
		}
	}
}

// runRecoverHelper runs the helper for phase and returns its
// announcements: word -> the fields after it (MADE lines accumulate).
func runRecoverHelper(t *testing.T, dir, phase string) map[string][]string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRecoverAfterCrash$", "-test.v")
	cmd.Env = append(os.Environ(), "ARBOR_CRASH_HELPER="+dir, crashAtEnv+"="+phase, "ARBOR_INIT="+sandboxtest.InitBinary(t))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The helper's hot image tmpfs outlives it (newRig unmounts it too).
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "engine", "images", "hot"), unix.MNT_DETACH) })
	out := map[string][]string{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.ToUpper(f[0]) != f[0] || strings.HasPrefix(f[0], "---") || f[0] == "===" {
			continue
		}
		out[f[0]] = append(out[f[0]], f[1:]...)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	killed := false
	if errors.As(err, &ee) {
		ws, ok := ee.Sys().(syscall.WaitStatus)
		killed = ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	if !killed {
		t.Fatalf("helper was not killed at phase %s: %v (announced %v)", phase, err, out)
	}
	if len(out["ENV"]) != 1 || out["KILLED"] == nil || (phase != "lost" && len(out["COMMITTED"]) != 2) {
		t.Fatalf("helper announced %v", out)
	}
	return out
}

// recoverHelper builds the env described above in the engine on
// $ARBOR_CRASH_HELPER and SIGKILLs itself in the turn-three checkpoint at
// the phase $ARBOR_CRASH_AT.
func recoverHelper(t *testing.T) {
	dir, phase := os.Getenv("ARBOR_CRASH_HELPER"), os.Getenv(crashAtEnv)
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: 4 << 30, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c := requireCR(t)
	l := &launch.Launcher{Snap: snap, Images: &image.Store{Snap: snap, Logger: quiet()}, InitBinary: sandboxtest.InitBinary(t), AutoBuild: true, Logger: quiet()}
	e, err := branch.Open(ctx, branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	var envID string
	labeled := make(chan struct{}) // the kill waits until the env has its labels
	kill := func(at string) {
		branch.SetCrashHook(func(p string, made []manifest.Artifact) {
			if p != at {
				return
			}
			<-labeled
			for _, a := range made {
				fmt.Printf("MADE %s %s\n", a.Kind, a.Location)
			}
			if envID == "" { // the env's first checkpoint: NewEnv has not returned
				envID = e.Envs()[0].ID
			}
			fmt.Printf("ENV %s\nKILLED %s\n", envID, p)
			os.Stdout.Sync()
			unix.Kill(os.Getpid(), unix.SIGKILL)
			select {}
		})
	}
	label := func(env *branch.Env) {
		if err := e.SetLabels(env, map[string]string{"owner": "helper"}); err != nil {
			t.Fatal(err)
		}
		close(labeled)
	}
	if phase == "lost" {
		kill("intent")
		env, _, err := e.NewEnv(ctx, "busybox")
		if err != nil {
			t.Fatal(err)
		}
		label(env)
		e.WaitCheckpoint(ctx, env)
		t.Fatal("first checkpoint finished: the hook did not kill")
	}
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	envID = env.ID
	label(env)
	start, read := counterCmd("busybox")
	run(t, e, env, recoverTurn1)
	run(t, e, env, start)
	run(t, e, env, read) // 1
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	run(t, e, env, recoverTurn2)
	run(t, e, env, read) // 2
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("COMMITTED %s %d\n", sid, env.Turn())
	run(t, e, env, recoverTurn3)
	run(t, e, env, read) // 3: in memory only, never committed
	kill(phase)
	e.Checkpoint(ctx, env, state.Full)
	t.Fatal("checkpoint finished: the hook did not kill")
}

// TestReviveAfterInitKilled kills a sandbox's init from the host (kill
// -9), between two commands, during one and before a checkpoint, and
// checks that the operation that finds it dead returns the infra error
// naming the state it restored, that the engine counted it, and that the
// env then works at its last committed state.
func TestReviveAfterInitKilled(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	e := r.e
	ctx := context.Background()
	start, read := counterCmd("busybox")
	for i, when := range []string{"between commands", "during a command", "before a checkpoint"} {
		t.Run(when, func(t *testing.T) {
			env, _, err := e.NewEnv(ctx, "busybox")
			if err != nil {
				t.Fatal(err)
			}
			run(t, e, env, recoverTurn1)
			run(t, e, env, start)
			run(t, e, env, recoverTurn2)
			run(t, e, env, read) // 1
			sid, err := e.Checkpoint(ctx, env, state.Full)
			if err != nil {
				t.Fatal(err)
			}
			turn := env.Turn()
			run(t, e, env, recoverTurn3) // never committed
			run(t, e, env, read)         // 2, never committed
			pid := env.Sandbox().InitPID()
			killInit := func() {
				if err := unix.Kill(pid, unix.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			var execErr error
			switch when {
			case "between commands":
				killInit()
				<-env.Sandbox().Exited()
				_, execErr = e.Exec(ctx, env, "echo never", sandbox.ExecOptions{Timeout: 10 * time.Second})
			case "before a checkpoint":
				killInit()
				<-env.Sandbox().Exited()
				_, execErr = e.Checkpoint(ctx, env, state.Full)
			case "during a command":
				done := make(chan error, 1)
				go func() {
					_, err := e.Exec(ctx, env, "touch /work/started; sleep 30", sandbox.ExecOptions{Timeout: time.Minute})
					done <- err
				}()
				started := fmt.Sprintf("/proc/%d/root/work/started", pid)
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if _, err := os.Stat(started); err == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the command never started")
					}
				}
				killInit()
				execErr = <-done
			}
			var rv *branch.RevivedError
			if !errors.As(execErr, &rv) || !errors.Is(execErr, sandbox.ErrDead) || !errors.Is(execErr, branch.ErrRevived) {
				t.Fatalf("exec after init was killed: %v, want a RevivedError", execErr)
			}
			if rv.Env != env.ID || rv.State != sid || rv.Turn != turn || !strings.Contains(execErr.Error(), sid) {
				t.Errorf("revived error %+v (%q), want env %s state %s turn %d", rv, execErr, env.ID, sid, turn)
			}
			u, err := e.Usage()
			if err != nil {
				t.Fatal(err)
			}
			if u.Coord.Revived != int64(i+1) {
				t.Errorf("revived count %d, want %d", u.Coord.Revived, i+1)
			}
			if env.Sandbox().InitPID() == pid || env.Head() != sid || env.Turn() != turn {
				t.Errorf("after revive: init %d (killed %d), head %s turn %d, want %s turn %d",
					env.Sandbox().InitPID(), pid, env.Head(), env.Turn(), sid, turn)
			}
			if got := run(t, e, env, "cat /work/f; echo $V; ls /work; "+read); got != "two\ntwo\nf\n2\n" {
				t.Errorf("env after revive: %q, want the committed state (and counter 2)", got)
			}
			if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
				t.Errorf("checkpoint after revive: %v", err)
			}
		})
	}
}

// TestNoRecover: with Options.NoRecover the envs a crash left open are
// closed, not restored, as CloseEnv closes them: their committed states
// stay usable for the retention, and the GC removes them after it.
func TestNoRecover(t *testing.T) {
	c := requireCR(t)
	dir := t.TempDir()
	snap := newBtrfs(t, dir)
	out := runRecoverHelper(t, dir, "commit")
	l := &launch.Launcher{Snap: snap, Images: &image.Store{Snap: snap, Logger: quiet()}, InitBinary: sandboxtest.InitBinary(t), AutoBuild: true, Logger: quiet()}
	o := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, NoRecover: true, Retain: time.Hour, Logger: quiet()}
	e, err := branch.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	if _, err := e.Env(out["ENV"][0]); !errors.Is(err, state.ErrUnknownEnv) || len(e.Envs()) != 0 || len(e.Lost()) != 0 {
		t.Fatalf("NoRecover: Env = %v, %d envs, lost %+v; want the env closed", err, len(e.Envs()), e.Lost())
	}
	res, err := e.Branch(context.Background(), branch.Source{State: out["COMMITTED"][0]}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("committed state after NoRecover: %v %v", err, res.Errors)
	}
	if got := run(t, e, res.Children[0], "cat /work/f; echo $V"); got != "two\ntwo\n" {
		t.Errorf("committed state restored to %q", got)
	}
	if err := e.CloseEnv(context.Background(), res.Children[0]); err != nil {
		t.Fatal(err)
	}
	branch.AdvanceClock(e, time.Hour+time.Second)
	collected(t, e, snap)
}
