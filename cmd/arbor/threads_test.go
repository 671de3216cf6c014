package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// threadsOf reads the number of OS threads of process pid.
func threadsOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/PID/status")
	return 0
}

// TestServeThreadsBounded loads the real `arbor serve` with 32 concurrent
// connections, each making an env, stepping it, branching it and stepping
// every child, so that more sandboxes are open at once than the bound
// below: the server's OS threads stay under 2 x GOMAXPROCS + 64. (Each
// sandbox's init used to hold a thread blocked in waitid for its whole
// life: 130 envs, 140 threads, and the runtime never frees them.) The
// bound leaves room for the 32 requests' blocking file system calls.
func TestServeThreadsBounded(t *testing.T) {
	servetest.RequireHost(t)
	addr := servetest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	const conns = 32
	bound := 2*runtime.GOMAXPROCS(0) + 64
	kids := max(3, bound/conns+2) // conns*(kids+1) envs: more than bound
	srv, c := startServe(t, ctx, t.TempDir(), addr, "--max-envs", strconv.Itoa(conns*(kids+1)+8))
	c.Close()
	idle := threadsOf(t, srv.Pid())

	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				c, err := arbor.Dial(ctx, addr, nil)
				if err != nil {
					return err
				}
				defer c.Close()
				r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
				if err != nil {
					return err
				}
				s, err := c.Step(ctx, r.EnvID, arbor.Bash("echo parent > /tmp/f", 0))
				if err != nil {
					return err
				}
				br, err := c.Branch(ctx, arbor.BranchParams{StateID: s.Info.StateID, N: kids})
				if err != nil {
					return err
				}
				if br.Errors != nil {
					return fmt.Errorf("branch: %v", br.Errors)
				}
				for _, id := range append(br.EnvIDs, r.EnvID) {
					if _, err := c.Step(ctx, id, arbor.Bash("cat /tmp/f", 0)); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Every env is still open: their sandboxes are all alive now.
	loaded := threadsOf(t, srv.Pid())
	t.Logf("arbor serve threads: %d idle, %d with %d envs open after %d-way load (bound %d)", idle, loaded, conns*(kids+1), conns, bound)
	if loaded > bound {
		t.Errorf("arbor serve has %d OS threads with %d envs open, want at most %d (2 x GOMAXPROCS + 64)", loaded, conns*(kids+1), bound)
	}
}
