package agent_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/arbor-env/arbor/agent"
)

// BenchmarkToolLatency times tool calls end to end through the SDK's
// client and the real server: a bash call once the previous turn's
// checkpoint is done (a model's thinking time hides it), one made right
// after another (it waits for that checkpoint), read_file, fork_try and
// rollback. Timings are a benchmark's business, not a test's.
func BenchmarkToolLatency(b *testing.B) {
	s := newServer(b, "")
	cs := mustConnect(b, "http://"+s.addr+"/v1/mcp?image=busybox", "")
	call := func(name string, args map[string]any) {
		b.Helper()
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || r.IsError {
			b.Fatalf("%s: %v %s", name, err, text(r))
		}
	}
	var first agent.BashResult
	ok(b, cs, "bash", map[string]any{"cmd": "mkdir -p /work && cd /work && echo 0 > n"}, &first)
	settle := func() { // list_states waits for the pending checkpoint
		b.StopTimer()
		call("list_states", nil)
		b.StartTimer()
	}
	b.Run("bash_settled", func(b *testing.B) {
		for b.Loop() {
			settle()
			call("bash", map[string]any{"cmd": "echo 1 > n"})
		}
	})
	b.Run("bash_back_to_back", func(b *testing.B) {
		for b.Loop() {
			call("bash", map[string]any{"cmd": "cat n"})
		}
	})
	b.Run("read_file", func(b *testing.B) {
		for b.Loop() {
			settle()
			call("read_file", map[string]any{"path": "n"})
		}
	})
	b.Run("fork_try", func(b *testing.B) {
		for b.Loop() {
			settle()
			call("fork_try", map[string]any{"cmd": "echo x >> n"})
		}
	})
	b.Run("rollback", func(b *testing.B) {
		for b.Loop() {
			settle()
			call("rollback", map[string]any{"state_id": first.StateID})
		}
	})
}
