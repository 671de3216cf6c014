package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// TestServeOneServerPerStateDir runs the real `arbor serve` and starts a
// second on the same state dir: it exits at once, non-zero, naming the
// first's pid, and the first still serves (a reset and a step succeed, its
// pool still mounted). A third, with --wait-lock, waits while the first
// runs (listening on nothing) and starts once the first has stopped; it
// then serves the same state dir.
func TestServeOneServerPerStateDir(t *testing.T) {
	servetest.RequireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	bin := servetest.Bin(t)
	dir := t.TempDir()
	args := []string{"--warm", "0", "--env-idle-ttl", "-1s", "--tasks", "", "--inspector", "off"}
	first := servetest.Start(t, servetest.Options{Bin: bin, StateDir: dir, Args: args})
	c := first.Dial(t, ctx, 3*time.Minute)
	defer c.Close()

	start := time.Now()
	second := servetest.Start(t, servetest.Options{Bin: bin, StateDir: dir, Args: args})
	select {
	case <-second.Exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("a second arbor serve on the same state dir still runs after 30 s:\n%s", second.Tail())
	}
	took := time.Since(start)
	if second.WaitErr == nil || second.Cmd.ProcessState.ExitCode() == 0 {
		t.Errorf("the second arbor serve exited %v, want a non-zero status", second.WaitErr)
	}
	msg := second.Tail()
	if want := fmt.Sprintf("pid %d", first.Pid()); !strings.Contains(msg, want) || !strings.Contains(msg, "--wait-lock") {
		t.Errorf("the second arbor serve said %q: want the holder (%s) and --wait-lock named", msg, want)
	}
	if took > 10*time.Second {
		t.Errorf("the second arbor serve took %s to give up", took)
	}
	t.Logf("second server (%s): %s", took.Round(time.Millisecond), msg)

	// The first still serves, on its pool.
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatalf("reset on the first server after the second gave up: %v", err)
	}
	step(t, ctx, c, r.EnvID, "echo still > /x && cat /x")
	if !strings.Contains(strings.Join(mountsBelow(dir), " "), filepath.Join(dir, "pool")) {
		t.Errorf("the first server's pool is no longer mounted: %v", mountsBelow(dir))
	}
	c.Close()

	// --wait-lock: the third waits for the first, then starts.
	third := servetest.Start(t, servetest.Options{Bin: bin, StateDir: dir, Args: append([]string{"--wait-lock", "3m"}, args...)})
	time.Sleep(3 * time.Second)
	select {
	case <-third.Exited:
		t.Fatalf("arbor serve --wait-lock 3m exited while the first ran: %v\n%s", third.WaitErr, third.Tail())
	default:
	}
	if conn, err := arbor.Dial(ctx, third.Addr, nil); err == nil {
		conn.Close()
		t.Fatal("arbor serve --wait-lock answers while the first server holds the state dir")
	}
	if !strings.Contains(third.Tail(), "waiting for the state dir") {
		t.Errorf("arbor serve --wait-lock did not say it waits: %q", third.Tail())
	}
	if err := first.Stop(2 * time.Minute); err != nil {
		t.Fatalf("stop the first server: %v", err)
	}
	c3 := third.Dial(t, ctx, 3*time.Minute)
	defer c3.Close()
	r3, err := c3.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatalf("reset on the server that waited: %v", err)
	}
	step(t, ctx, c3, r3.EnvID, "true")
	c3.Close()
	if err := third.Stop(2 * time.Minute); err != nil {
		t.Errorf("stop the third server: %v", err)
	}
}
