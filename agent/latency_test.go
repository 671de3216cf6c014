package agent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/arbor-env/arbor/agent"
)

// TestLatency measures tool calls end to end through the SDK's client and
// the real server: a bash call once the previous turn's checkpoint is
// done (a model's thinking time hides it), one made right after another
// (it waits for that checkpoint), fork_try and rollback. It logs medians;
// -short skips it.
func TestLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("latency measurement skipped in -short mode")
	}
	s := newServer(t, "")
	cs := mustConnect(t, "http://"+s.addr+"/v1/mcp?image=busybox", "")
	timed := func(name string, args map[string]any) time.Duration {
		t.Helper()
		start := time.Now()
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		d := time.Since(start)
		if err != nil || r.IsError {
			t.Fatalf("%s: %v %s", name, err, text(r))
		}
		return d
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	const n = 7
	var first agent.BashResult
	ok(t, cs, "bash", map[string]any{"cmd": "mkdir -p /work && cd /work && echo 0 > n"}, &first)
	var settled, backToBack, readFile, fork, rollback []time.Duration
	for i := 0; i < n; i++ {
		timed("list_states", nil) // waits for the pending checkpoint
		settled = append(settled, timed("bash", map[string]any{"cmd": "echo $((i+1)) > n"}))
		backToBack = append(backToBack, timed("bash", map[string]any{"cmd": "cat n"}))
		timed("list_states", nil)
		readFile = append(readFile, timed("read_file", map[string]any{"path": "n"}))
		fork = append(fork, timed("fork_try", map[string]any{"cmd": "echo x >> n"}))
		rollback = append(rollback, timed("rollback", map[string]any{"state_id": first.StateID}))
	}
	t.Logf("median of %d: bash (checkpoint settled) %v, bash back-to-back %v, read_file %v, fork_try %v, rollback %v",
		n, median(settled), median(backToBack), median(readFile), median(fork), median(rollback))
}
