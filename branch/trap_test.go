package branch_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/state"
)

// TestCheckpointWhileInitGetsSIGTRAP: processes of the sandbox that send
// SIGTRAP to init in tight loops must not make checkpoints fail. Compel
// refuses to dump a thread with a pending SIGTRAP, and one caught by init
// that lands just before the freeze stays pending on init's frozen
// thread; init leaves SIGTRAP at SIG_DFL, so the kernel drops it
// (docs/sandbox.md).
func TestCheckpointWhileInitGetsSIGTRAP(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		run(t, e, env, `(while :; do kill -TRAP 1; done) </dev/null >/dev/null 2>&1 &`)
	}
	failed := 0
	const n = 30
	for i := 0; i < n; i++ {
		kind := state.Proc
		if i%2 == 1 {
			kind = state.Full
		}
		if _, err := e.Checkpoint(ctx, env, kind); err != nil {
			failed++
			t.Logf("checkpoint %d (%s): %v", i, kind, err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d checkpoints failed while init got SIGTRAP in a loop", failed, n)
	}
	// The loops (four sh next to the agent's shell) ran throughout.
	// pidof runs as a busybox applet in a fork of the shell, so the
	// pipeline itself may add an sh of its own: at least 5.
	got := strings.TrimSpace(run(t, e, env, `pidof sh | wc -w`))
	if n, err := strconv.Atoi(got); err != nil || n < 5 {
		t.Errorf("sh processes after the checkpoints: %q, want at least 5 (the shell and the loops)", got)
	}
}
