package router_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// TestMigrate moves an env mid-episode from one real node to the other
// through the router, with steps pipelined behind the migrate: they wait
// and run on the new node, in order; the env keeps its id, its state
// ids, its files and shell, its background process's memory and its
// step keys (a keyed step retried there is answered, not run again); the
// placement in etcd names the new node and the old one has no env left.
func TestMigrate(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdClient(t, etcd)
	a := startNode(t, etcd, "a", "127.0.0.2")
	b := startNode(t, etcd, "b", "127.0.0.3")
	nodes := map[string]*node{a.id: a, b.id: b}
	_, addr := startRouter(t, etcd)
	ctx := context.Background()
	c := dial(t, addr)
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	src := nodes[placement(t, cli, env)]
	dst := a
	if src == a {
		dst = b
	}
	sh(t, c, env, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && echo data > /work/file")
	sh(t, c, env, counterStart)
	base, err := strconv.Atoi(out(sh(t, c, env, counterRead)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		sh(t, c, env, fmt.Sprintf("echo before%d >> /work/log", i))
	}
	// A keyed step here, retried after the move: the target answers its
	// recorded result, it does not run again.
	keyed := arbor.Bash("echo once >> /work/keyed; cat /work/keyed", 0)
	k1, err := c.StepKeyed(ctx, env, "before-the-move", keyed)
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.States(ctx, env)
	if err != nil {
		t.Fatal(err)
	}

	// Under pipelined load: a step is sent every 40 ms, without waiting
	// for the one before (at most 4 in flight), from before the migrate
	// until after it answered. Those that reach the source during the pre-copy run
	// there; those sent while the env is stopped wait in the router and
	// run on the new node; all in their order.
	mig, err := c.Send(protocol.MethodMigrate, protocol.MigrateParams{EnvID: env}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var res protocol.MigrateResult
	var migErr error
	migrated := make(chan struct{})
	go func() { migErr = mig.Wait(ctx, &res); close(migrated) }()
	type stepRes struct {
		sr   arbor.StepResult
		err  error
		done chan struct{}
	}
	var steps []*stepRes
	var during []bool               // sent before the migrate answered
	slots := make(chan struct{}, 4) // at most 4 steps in flight
	for after := 0; after < 3; {
		select {
		case <-migrated:
			after++
		default:
		}
		slots <- struct{}{}
		p, err := c.Send(protocol.MethodStep, protocol.StepParams{EnvID: env,
			Action: arbor.Bash(fmt.Sprintf("echo step%d >> /work/log; %s", len(steps), counterRead), 0)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sr := &stepRes{done: make(chan struct{})}
		go func() {
			defer func() { <-slots }()
			sr.err = p.Wait(ctx, &sr.sr)
			close(sr.done)
		}()
		steps, during = append(steps, sr), append(during, after == 0)
		time.Sleep(40 * time.Millisecond)
	}
	<-migrated
	if migErr != nil {
		t.Fatalf("migrate: %v", migErr)
	}
	t.Logf("migrated %s from %s to %s at %s: pause %.3f s, total %.3f s, %d bytes before the pause, %d during it; %d steps sent",
		env, res.From, res.Node, res.StateID, res.PauseS, res.TookS, res.PreBytes, res.Bytes, len(steps))
	if res.From != src.id || res.Node != dst.id {
		t.Errorf("migrate result %+v, want from %s to %s", res, src.id, dst.id)
	}
	waited := 0
	var log strings.Builder
	for i, p := range steps {
		<-p.done
		if p.err != nil {
			t.Fatalf("step %d of the load: %v", i, p.err)
		}
		sr := p.sr
		if got := strings.TrimSpace(string(sr.Obs.Stdout)); got != strconv.Itoa(base+1+i) || sr.Obs.ExitCode != 0 {
			where := "source"
			if st, err := dst.eng.State(sr.Info.StateID); err == nil && st.Timings != nil {
				where = "target"
			}
			t.Errorf("step %d of the load: counter %q exit %d, want %d (turn %d, state %s, made on the %s)", i, got, sr.Obs.ExitCode, base+1+i, sr.Info.Turn, sr.Info.StateID, where)
			if t.Failed() && i > 3 {
				break
			}
		}
		fmt.Fprintf(&log, "step%d\n", i)
		// A state the target's own checkpoint made (imported ones carry
		// no timings): the step ran there.
		if st, err := dst.eng.State(sr.Info.StateID); err == nil && st.Timings != nil && during[i] {
			waited++
		}
	}
	t.Logf("%d steps sent during the migration ran on the new node", waited)
	if waited == 0 {
		t.Errorf("no step sent during the migration ran on the new node")
	}
	if n := placement(t, cli, env); n != dst.id {
		t.Errorf("placement after migrate: %q, want %s", n, dst.id)
	}
	if _, err := src.eng.Env(env); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("the source still has the env: %v", err)
	}
	if _, err := dst.eng.Env(env); err != nil {
		t.Errorf("the target has no env %s: %v", env, err)
	}
	if t.Failed() {
		seen := map[string]int{}
		for _, l := range strings.Split(out(sh(t, c, env, "cat /work/log")), "\n") {
			if seen[l]++; seen[l] > 1 {
				t.Logf("log line %q twice", l)
			}
		}
	}
	if got := string(sh(t, c, env, shellState+"; cat /work/log").Obs.Stdout); got != "cwd=/work K=v\nfun\ndata\nbefore0\nbefore1\nbefore2\n"+log.String() {
		t.Errorf("after the migration: %q", got)
	}
	k2, err := c.StepKeyed(ctx, env, "before-the-move", keyed)
	if err != nil || !k2.Info.Replayed || string(k2.Obs.Stdout) != string(k1.Obs.Stdout) || k2.Info.StateID != k1.Info.StateID {
		t.Errorf("keyed step retried after the move: %+v %v, want the replay of %+v", k2, err, k1)
	}
	if got := out(sh(t, c, env, "cat /work/keyed")); got != "once" {
		t.Errorf("the keyed step's file after its retry on the target: %q", got)
	}
	after, err := c.States(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range before.States {
		if i >= len(after.States) || after.States[i].StateID != st.StateID {
			t.Fatalf("state %d before the migration %s, after it %v", i, st.StateID, after.States)
		}
	}
	// The states of before the migration are the target's now: a
	// rollback to one restores it there.
	if _, err := c.Rollback(ctx, env, before.States[len(before.States)-3].StateID); err != nil {
		t.Fatalf("rollback on the target to a state of before the migration: %v", err)
	}
	if got := out(sh(t, c, env, "cat /work/log")); got != "before0\nbefore1" {
		t.Errorf("after the rollback: %q", got)
	}
	// And back again, with the env's counter still counting.
	back, err := c.Migrate(ctx, env, src.id)
	if err != nil {
		t.Fatalf("migrate back: %v", err)
	}
	t.Logf("migrated back: pause %.3f s, total %.3f s, %d + %d bytes", back.PauseS, back.TookS, back.PreBytes, back.Bytes)
	if n := placement(t, cli, env); n != src.id {
		t.Errorf("placement after migrating back: %q", n)
	}
	if err := c.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	if n := placement(t, cli, env); n != "" {
		t.Errorf("placement after close: %q", n)
	}
	if _, err := c.Migrate(ctx, "nope", ""); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("migrate of an unknown env: %v", err)
	}
}
