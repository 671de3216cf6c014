package server_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch/branchtest"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
)

// TestExposedCheckpointTime: steps of several envs that wait at once for
// their envs' background checkpoints, held queued behind a busy queue and
// then run a worker's turn after another, are exposed for no more than
// the checkpoints ran: arbor_checkpoint_exposed_seconds_total never
// exceeds arbor_checkpoint_time_seconds_total (the web view showed 2147 %
// when every waiter's wait, queue included, was counted).
func TestExposedCheckpointTime(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	// An engine of its own: HoldQueue needs every worker.
	e := branchtest.ForTest(t, branchtest.Options{}).Engine
	reg := prometheus.NewRegistry()
	co, err := coordinator.New(coordinator.Options{Engine: e, Logger: quiet(), Registry: reg, Classify: coordinator.Full})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)
	s, err := server.New(server.Options{Coordinator: co, Logger: quiet(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
	})
	c := dial(t, strings.TrimPrefix(hs.URL, "http://"), nil)
	ctx := context.Background()
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// More waiters than workers: they queue behind each other too.
	n := 2*u.Queue.Workers + 2
	envs := make([]string, n)
	for i := range envs {
		envs[i] = reset(t, c, arbor.ResetParams{Image: "busybox"})
		sh(t, c, envs[i], "echo 0 > /f")
	}
	release := branchtest.HoldQueue(t, e, "busybox")
	for _, env := range envs {
		sh(t, c, env, "echo 1 > /f") // its checkpoint is queued, held
	}
	done := make(chan error, n)
	for _, env := range envs {
		go func() {
			_, err := c.Step(ctx, env, arbor.Bash("cat /f", 20*time.Second))
			done <- err
		}()
	}
	branchtest.WaitFor(t, "every step waiting for its checkpoint", func() bool {
		u, err := e.Usage()
		return err == nil && u.Queue.High.Queued >= n
	})
	// The waits, queue included, now outgrow what the holders' and the
	// envs' checkpoints will run.
	time.Sleep(time.Second)
	release()
	for range envs {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	exposed := metricValue(t, reg, "arbor_checkpoint_exposed_seconds_total")
	total := metricValue(t, reg, "arbor_checkpoint_time_seconds_total")
	if exposed <= 0 || exposed > total {
		t.Errorf("exposed checkpoint time %.3f s of %.3f s of checkpoints: want more than 0, at most all of it", exposed, total)
	}
}
