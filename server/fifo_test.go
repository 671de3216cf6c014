package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
)

// TestFileToolsFIFOTimeout: read_file and write_file honour timeout_s. A
// FIFO with no writer (or reader) answers timed_out within the timeout
// asked, not the default 60 s, and the shell serves the next step; a FIFO
// whose writer comes within the timeout is read.
func TestFileToolsFIFOTimeout(t *testing.T) {
	_, addr := newServer(t, server.Options{})
	ctx := context.Background()
	c := dial(t, addr, nil)
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	sh(t, c, env, "mkfifo /tmp/none /tmp/late")

	for _, tt := range []struct {
		name string
		a    arbor.Action
	}{
		{"read_file", arbor.Action{Tool: "read_file", Path: "/tmp/none", TimeoutS: 2}},
		{"write_file", arbor.Action{Tool: "write_file", Path: "/tmp/none", Content: []byte("x"), TimeoutS: 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			res, err := c.Step(ctx, env, tt.a)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("%s of a FIFO nobody opens: %v", tt.name, err)
			}
			if !res.Obs.TimedOut || res.Obs.ExitCode == 0 {
				t.Errorf("%s of a FIFO nobody opens: timed_out %v exit %d, want a timeout", tt.name, res.Obs.TimedOut, res.Obs.ExitCode)
			}
			if took < 2*time.Second || took > 10*time.Second {
				t.Errorf("%s with timeout_s 2 answered after %s", tt.name, took)
			}
			if got := strings.TrimSpace(string(sh(t, c, env, "echo alive").Obs.Stdout)); got != "alive" {
				t.Errorf("the shell after the timeout: %q", got)
			}
		})
	}

	// A writer within the timeout: read_file answers what it wrote.
	sh(t, c, env, "(sleep 1; echo hello > /tmp/late) >/dev/null 2>&1 &")
	start := time.Now()
	res, err := c.Step(ctx, env, arbor.Action{Tool: "read_file", Path: "/tmp/late", TimeoutS: 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Obs.Stdout); got != "hello\n" || res.Obs.TimedOut || res.Obs.ExitCode != 0 {
		t.Errorf("read_file of a FIFO with a writer: %q timed_out %v exit %d", got, res.Obs.TimedOut, res.Obs.ExitCode)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("read_file of a FIFO with a writer took %s", took)
	}

	// A negative timeout is refused, for the file tools as for bash.
	if _, err := c.Step(ctx, env, arbor.Action{Tool: "read_file", Path: "/tmp/late", TimeoutS: -1}); err == nil || !strings.Contains(err.Error(), "timeout_s") {
		t.Errorf("read_file with timeout_s -1: %v, want an invalid timeout_s", err)
	}
}
