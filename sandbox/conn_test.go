package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
)

// TestConnectionLifeConcurrent drives the control connection's whole life
// at once: commands whose contexts expire (deadline) or are cancelled
// while their answer is being read, commands that run to their end,
// Disconnect, and finally Destroy while commands are in flight. A context
// that ends mid-read used to have its AfterFunc set a deadline on the
// connection field that the failed read had just cleared (nil dereference:
// the server process died). Run it with -race.
func TestConnectionLifeConcurrent(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	run(t, sb, "KEEP=yes", 5*time.Second)

	// ended accepts an error of a command whose context ended.
	ended := func(err error) bool {
		return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	}
	const workers, rounds = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, 4*workers*rounds)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				d := time.Duration(rand.IntN(20_000)) * time.Microsecond
				var ctx context.Context
				var cancel context.CancelFunc
				if (w+i)%2 == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), d)
				} else {
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(d, cancel)
				}
				r, err := sb.Exec(ctx, "sleep 0.01; echo ok", sandbox.ExecOptions{Timeout: 5 * time.Second})
				cancel()
				switch {
				case err == nil && string(r.Stdout) != "ok\n":
					errs <- errors.New("a command that ended early answered " + string(r.Stdout))
				case err != nil && !ended(err):
					errs <- fmt.Errorf("a command whose context ended: %w", err)
				}
			}
		})
	}
	wg.Go(func() {
		for range rounds {
			r, err := sb.Exec(context.Background(), "echo $KEEP", sandbox.ExecOptions{Timeout: 5 * time.Second})
			if err != nil {
				errs <- fmt.Errorf("a command with no deadline: %w", err)
			} else if string(r.Stdout) != "yes\n" {
				errs <- errors.New("a command with no deadline answered " + string(r.Stdout))
			}
		}
	})
	wg.Go(func() {
		for range 2 * rounds {
			sb.Disconnect()
			time.Sleep(time.Duration(rand.IntN(5_000)) * time.Microsecond)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("exec: %v", err)
	}
	if r := run(t, sb, "echo $KEEP", 5*time.Second); string(r.Stdout) != "yes\n" {
		t.Fatalf("after the storm the shell answered %q, want yes", r.Stdout)
	}

	// Destroy while commands are in flight, some with ending contexts:
	// each ends with an error (or its answer), none brings the process
	// down.
	var fl sync.WaitGroup
	for w := range workers {
		fl.Go(func() {
			for i := 0; ; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rand.IntN(10))*time.Millisecond)
				if (w+i)%2 == 0 {
					cancel()
					ctx, cancel = context.WithCancel(context.Background())
				}
				_, err := sb.Exec(ctx, "sleep 0.005", sandbox.ExecOptions{Timeout: 5 * time.Second})
				cancel()
				if errors.Is(err, sandbox.ErrClosed) {
					return
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	fl.Wait()
}
