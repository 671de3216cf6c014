package branchtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/state"
)

// HoldQueue occupies every worker of e's queue with a checkpoint that
// waits at its sandbox's lock, so that no other checkpoint or restore
// starts until release is called. Tests use it to keep a background
// checkpoint pending (its state id handed out, its state not committed)
// for as long as they need, instead of hoping a race goes their way. The
// holders are envs of image that release closes. e must be the test's own
// engine: a job of someone else's queued at high priority would keep
// HoldQueue from knowing that every holder runs.
func HoldQueue(tb testing.TB, e *branch.Engine, image string) (release func()) {
	tb.Helper()
	ctx := context.Background()
	u, err := e.Usage()
	if err != nil {
		tb.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var envs []*branch.Env
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			for _, env := range envs {
				if err := e.CloseEnv(ctx, env); err != nil {
					fail(err)
				}
			}
			if err := errors.Join(errs...); err != nil {
				tb.Errorf("queue holders: %v", err)
			}
		})
	}
	tb.Cleanup(release)
	for range u.Queue.Workers {
		env, _, err := e.NewEnv(ctx, image)
		if err != nil {
			tb.Fatal(err)
		}
		envs = append(envs, env)
		if _, err := e.WaitCheckpoint(ctx, env); err != nil {
			tb.Fatal(err)
		}
		if err := env.TakeCheckpointError(); err != nil {
			tb.Fatal(err)
		}
		held := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := env.Sandbox().Exclusive(func() error {
				held <- nil
				<-stop
				return nil
			})
			if err != nil {
				held <- err
			}
		}()
		if err := <-held; err != nil {
			tb.Fatal(err)
		}
		// The checkpoint's job takes a worker and waits for the sandbox;
		// its state id becomes the head when it is queued.
		prev := env.Head()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
				fail(err)
			}
		}()
		WaitFor(tb, "holder checkpoint queued", func() bool { return env.Head() != prev })
	}
	// Every holder is high priority: none is left waiting once all the
	// workers run and no high job is queued.
	WaitFor(tb, "holders running on every worker", func() bool {
		u, err := e.Usage()
		return err == nil && u.Queue.Running == u.Queue.Workers && u.Queue.High.Queued == 0
	})
	return release
}

// GhostHolder is a busybox command that starts a process holding open a
// deleted 72 MiB file, over the ghost limit (criu.DefaultGhostLimit, 64
// MiB): every dump of the env fails, with cr.ErrAgentState, until that
// process (sleep) is killed. The file is removed only once the process
// holds it (else the rm can win, the process never starts and the dump
// succeeds). It prints ok.
const GhostHolder = "dd if=/dev/zero of=/tmp/big bs=1M count=72 2>/dev/null; sleep 1000 </tmp/big >/dev/null 2>&1 & " +
	`until [ "$(readlink /proc/$!/fd/0)" = /tmp/big ]; do :; done; rm /tmp/big; echo ok`

// RaisedWaiting reports whether a job of e's queue is waiting at high
// priority: while HoldQueue holds the workers, that is a background
// checkpoint somebody now waits for (the gate raised it).
func RaisedWaiting(e *branch.Engine) bool {
	u, err := e.Usage()
	return err == nil && u.Queue.High.Queued > 0
}

// ReleaseWhenRaised lets the queue HoldQueue holds go (release) once an
// operation waits for a background checkpoint of e (RaisedWaiting), and
// returns the operation's answer from done. An answer that comes before
// the queue is let go did not wait; the caller's checks say so.
func ReleaseWhenRaised[T any](e *branch.Engine, release func(), done <-chan T) T {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	defer release()
	for {
		select {
		case a := <-done:
			return a
		case <-tick.C:
			if RaisedWaiting(e) {
				release()
			}
		}
	}
}

// WaitFor polls ok until it holds, failing tb after a minute.
func WaitFor(tb testing.TB, what string, ok func() bool) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
