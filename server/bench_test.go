package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/state"
)

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkStepRoundTrip compares a step over the websocket (gate,
// command, queueing the checkpoint, msgpack both ways) with the same
// command run directly in the sandbox. Turns are classified none, so no
// checkpoint runs between them and the difference is the server's own
// overhead.
func BenchmarkStepRoundTrip(b *testing.B) {
	_, addr := newServerWith(b, server.Options{}, coordinator.Options{Classify: classifyAs(state.None)})
	ctx := context.Background()
	c := dial(b, addr, nil)
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseEnv(ctx, r.EnvID)
	sh(b, c, r.EnvID, "true") // past the initial checkpoint
	env, _ := engine.Env(r.EnvID)
	const cmd = "echo hi"
	ws := make([]time.Duration, 0, b.N)
	direct := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t := time.Now()
		if _, err := c.Step(ctx, r.EnvID, arbor.Bash(cmd, 0)); err != nil {
			b.Fatal(err)
		}
		ws = append(ws, time.Since(t))
		t = time.Now()
		if _, err := env.Sandbox().Exec(ctx, cmd, sandbox.ExecOptions{}); err != nil {
			b.Fatal(err)
		}
		direct = append(direct, time.Since(t))
	}
	b.StopTimer()
	w50, w99, d50, d99 := percentile(ws, .5), percentile(ws, .99), percentile(direct, .5), percentile(direct, .99)
	b.ReportMetric(float64(w50.Microseconds()), "ws-p50-us")
	b.ReportMetric(float64(w99.Microseconds()), "ws-p99-us")
	b.ReportMetric(float64(d50.Microseconds()), "direct-p50-us")
	b.ReportMetric(float64(d99.Microseconds()), "direct-p99-us")
	b.ReportMetric(float64((w50 - d50).Microseconds()), "overhead-p50-us")
	b.ReportMetric(float64((w99 - d99).Microseconds()), "overhead-p99-us")
}

// BenchmarkBranch8 is branch(8) end to end over the websocket, from a
// checkpointed state, children closed between iterations.
func BenchmarkBranch8(b *testing.B) {
	_, addr := newServer(b, server.Options{})
	ctx := context.Background()
	c := dial(b, addr, nil)
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseEnv(ctx, r.EnvID)
	s := sh(b, c, r.EnvID, "(while :; do sleep 1; done) >/dev/null 2>&1 & echo x > /tmp/f")
	var took []time.Duration
	b.ResetTimer()
	for range b.N {
		t := time.Now()
		br, err := c.Branch(ctx, arbor.BranchParams{StateID: s.Info.StateID, N: 8})
		if err != nil || br.Errors != nil {
			b.Fatal(err, br.Errors)
		}
		took = append(took, time.Since(t))
		b.StopTimer()
		for _, id := range br.EnvIDs {
			c.CloseEnv(ctx, id)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(took, .5).Milliseconds()), "p50-ms")
}

// BenchmarkSteps64 is steps per second with 64 envs stepped concurrently
// over one pipelined connection, each turn checkpointed full in the
// background (as the coordinator's first cut does).
func BenchmarkSteps64(b *testing.B) {
	for _, tt := range []struct {
		name string
		kind state.Kind
	}{{"full", state.Full}, {"none", state.None}} {
		b.Run(tt.name, func(b *testing.B) {
			_, addr := newServerWith(b, server.Options{}, coordinator.Options{Classify: classifyAs(tt.kind)})
			ctx := context.Background()
			c := dial(b, addr, nil)
			const n = 64
			ids := make([]string, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
					if err != nil {
						b.Error(err)
						return
					}
					ids[i] = r.EnvID
					sh(b, c, r.EnvID, "true")
				}()
			}
			wg.Wait()
			defer func() {
				for _, id := range ids {
					c.CloseEnv(ctx, id)
				}
			}()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				for _, id := range ids {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := c.Step(ctx, id, arbor.Bash(fmt.Sprintf("echo %d >> /tmp/log", i), 0)); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.N*n)/time.Since(start).Seconds(), "steps/s")
		})
	}
}

// BenchmarkOpenEnvStep compares a step of `echo hi` through the OpenEnv
// endpoint (JSON text messages, one env per connection) with the same
// step over protocol v1 (msgpack), alternating the two on two envs of the
// same task on one server. Turns are classified none, so no checkpoint
// runs between them; the difference is the OpenEnv adapter's cost
// (docs/openenv.md, "Overhead").
func BenchmarkOpenEnvStep(b *testing.B) {
	_, addr := newServerWith(b, server.Options{}, coordinator.Options{Classify: classifyAs(state.None)})
	ctx := context.Background()
	c := dial(b, addr, nil)
	r, err := c.Reset(ctx, arbor.ResetParams{Task: testTask.Name})
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseEnv(ctx, r.EnvID)
	sh(b, c, r.EnvID, "true")
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/openenv/"+testTask.Name+"/ws", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ws.Close()
	call := func(msg string) map[string]any {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			b.Fatal(err)
		}
		_, raw, err := ws.ReadMessage()
		if err != nil {
			b.Fatal(err)
		}
		var a map[string]any
		if err := json.Unmarshal(raw, &a); err != nil || a["type"] != "observation" {
			b.Fatalf("answer %s: %v", raw, err)
		}
		return a
	}
	call(`{"type": "reset", "data": {}}`)
	const step = `{"type": "step", "data": {"tool": "bash", "cmd": "echo hi"}}`
	start := call(step)["data"].(map[string]any)["observation"].(map[string]any)["metadata"].(map[string]any)["state_id"].(string)
	v1 := make([]time.Duration, 0, b.N)
	oe := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		if i%30 == 29 {
			// Stay under the task's max_turns, which ends an OpenEnv
			// episode (and runs the verifier): roll both back, untimed.
			b.StopTimer()
			if _, err := c.Rollback(ctx, r.EnvID, r.Info.StateID); err != nil {
				b.Fatal(err)
			}
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type": "rollback", "data": {"state_id": "`+start+`"}}`))
			if _, _, err := ws.ReadMessage(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		t := time.Now()
		if _, err := c.Step(ctx, r.EnvID, arbor.Bash("echo hi", 0)); err != nil {
			b.Fatal(err)
		}
		v1 = append(v1, time.Since(t))
		t = time.Now()
		call(step)
		oe = append(oe, time.Since(t))
	}
	b.StopTimer()
	v50, v99, o50, o99 := percentile(v1, .5), percentile(v1, .99), percentile(oe, .5), percentile(oe, .99)
	b.ReportMetric(float64(v50.Microseconds()), "v1-p50-us")
	b.ReportMetric(float64(v99.Microseconds()), "v1-p99-us")
	b.ReportMetric(float64(o50.Microseconds()), "openenv-p50-us")
	b.ReportMetric(float64(o99.Microseconds()), "openenv-p99-us")
	b.ReportMetric(float64((o50 - v50).Microseconds()), "overhead-p50-us")
}
