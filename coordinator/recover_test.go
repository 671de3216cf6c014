package coordinator

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/server/protocol"
)

// lostHelperDir, set, makes TestLostOrphanForgotten the helper process
// that leaves a lost env in the engine on that state directory.
const lostHelperDir = "ARBOR_LOST_HELPER_DIR"

// TestLostOrphanForgotten: an env the coordinator never handed out (no
// served label: a task pool's reserve, an MCP session's) that a crash left
// lost is forgotten when a coordinator adopts the engine's envs, so its
// states are released, not kept across every later restart. A helper
// process makes such an env, its first checkpoint held in the queue so
// that it never commits, and kills itself (SIGKILL); this test reopens
// the engine on its state dir.
func TestLostOrphanForgotten(t *testing.T) {
	if dir := os.Getenv(lostHelperDir); dir != "" {
		lostHelper(t, dir)
		return
	}
	if skipReason != "" {
		t.Skip(skipReason)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLostOrphanForgotten$", "-test.v")
	cmd.Env = append(os.Environ(), lostHelperDir+"="+dir, branchtest.HelperVar+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var envID string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "LOST_ENV "); ok {
			envID = id
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || envID == "" {
		t.Fatalf("helper: %v, env %q; want it killed after naming its env", err, envID)
	}
	e := branchtest.ForTest(t, branchtest.Options{Dir: dir}).Engine
	if lost := e.Lost(); len(lost) != 1 || lost[0].ID != envID {
		t.Fatalf("reopened engine: lost %+v, want env %s: the test needs it lost", lost, envID)
	}
	c, err := New(Options{Engine: e, Logger: branchtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if lost := e.Lost(); len(lost) != 0 {
		t.Errorf("after adoption the engine still keeps lost %+v: nobody owns it", lost)
	}
	if lost := c.Lost(context.Background()); len(lost) != 0 {
		t.Errorf("the coordinator reports lost %+v, which it never handed out", lost)
	}
}

// lostHelper makes an env whose first checkpoint cannot run (the queue is
// held), names it, and dies by SIGKILL.
func lostHelper(t *testing.T, dir string) {
	e := branchtest.ForTest(t, branchtest.Options{Dir: dir}).Engine
	branchtest.HoldQueue(t, e, "busybox")
	env, _, err := e.NewEnv(context.Background(), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("LOST_ENV " + env.ID + "\n")
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// TestRevivedErrorCode: a turn words a revived sandbox as sandbox_failed,
// naming the state it was restored to, whatever killed it.
func TestRevivedErrorCode(t *testing.T) {
	err := revivedError(&branch.RevivedError{Env: "e-1", State: "s-1", Turn: 3, Cause: errors.New("oom")}, &entry{base: 1})
	if pe := protocol.ErrorOf(err); pe.Code != protocol.CodeSandboxFailed || !pe.Infra || !pe.Retryable || !strings.Contains(pe.Message, "state s-1 (turn 2)") {
		t.Errorf("revived: %+v", pe)
	}
}
