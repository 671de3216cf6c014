//go:build chaos

package stress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/servetest"
)

// TestChaos is `make chaos` (build tag chaos; not in make test): workers
// run episodes (steps that append to a file and set a shell variable,
// branches, rollbacks) against a real arbor serve while faults strike at
// random moments: the server killed with SIGKILL (mid-checkpoint and
// mid-branch: both run all the time), the CRIU processes it runs killed
// (mid-dump or mid-restore), and the state dir's disk full for a few
// seconds (manifest writes, process images and the pool fail). After each
// server kill it restarts on the same state dir. Every env's content is
// checked against a model of what each state id holds: on the first step
// after a restart, the env must hold exactly the state it says it was
// recovered at; at the end every state id the model knows is branched and
// compared. It reports envs lost (target 0) and states corrupted (target
// 0; a state that never committed is counted apart, not corrupted).
//
// Knobs: ARBOR_CHAOS_DURATION (default 5m), ARBOR_CHAOS_SEED,
// ARBOR_CHAOS_WORKERS (4).
func TestChaos(t *testing.T) {
	requireHost(t)
	dur := envDuration(t, "ARBOR_CHAOS_DURATION", 5*time.Minute)
	seed := envInt(t, "ARBOR_CHAOS_SEED", time.Now().UnixNano())
	workers := int(envInt(t, "ARBOR_CHAOS_WORKERS", 4))
	t.Logf("seed %d, %s, %d workers", seed, dur, workers)
	rng := rand.New(rand.NewSource(seed))

	// The state dir on a tmpfs of its own, so that "disk full" fills a
	// file system this test made and nothing of the host's.
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=6g", "arbor-chaos", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for the state dir: %v: %s", err, out)
	}
	t.Cleanup(func() {
		for _, m := range servetest.MountsBelow(dir) {
			exec.Command("umount", "-l", m.Point).Run()
		}
		exec.Command("umount", "-l", dir).Run()
	})
	addr := servetest.FreeAddr(t)
	start := func() *servetest.Server {
		return servetest.Start(t, servetest.Options{StateDir: dir, Addr: addr, Global: []string{"--log-level", "warn", "--pool-size", "3G"},
			Args: []string{"--warm", "-1", "--env-idle-ttl", "-1s", "--tasks", "", "--wait-lock", "30s"}})
	}
	srv := start()
	srv.Dial(t, context.Background(), 3*time.Minute).Close()
	// The pool's loop file gets all its blocks now: a full state dir then
	// fails the manifest's and the image store's writes, not the pool's
	// own (a loop device whose backing file cannot grow makes btrfs
	// read-only, which is another test's subject).
	if out, err := exec.Command("fallocate", "-l", "3G", filepath.Join(dir, "pool.img")).CombinedOutput(); err != nil {
		t.Fatalf("allocate the pool file: %v: %s", err, out)
	}

	m := &model{states: map[string]string{}}
	var (
		mu      sync.Mutex
		gen     int // bumps at every restart: workers re-dial
		faults  = map[string]int{}
		stopped = make(chan struct{})
	)
	current := func() (*servetest.Server, int) {
		mu.Lock()
		defer mu.Unlock()
		return srv, gen
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.worker(t, w, rand.New(rand.NewSource(seed+int64(w))), current, stopped)
		}()
	}
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(2000+rng.Intn(4000)) * time.Millisecond)
		s, _ := current()
		switch f := rng.Intn(3); f {
		case 0:
			s.Kill()
			mu.Lock()
			faults["server killed"]++
			srv = start()
			gen++
			mu.Unlock()
		case 1:
			n := killCRIU(s.Pid())
			mu.Lock()
			faults[fmt.Sprintf("criu killed (%d processes)", n)]++
			mu.Unlock()
		case 2:
			fill := filepath.Join(dir, "chaos-fill")
			exec.Command("fallocate", "-l", "6g", fill).Run()
			exec.Command("dd", "if=/dev/zero", "of="+fill, "bs=1M", "oflag=append", "conv=notrunc").Run()
			time.Sleep(3 * time.Second)
			os.Remove(fill)
			mu.Lock()
			faults["disk full for 3 s"]++
			mu.Unlock()
		}
	}
	close(stopped)
	wg.Wait()
	s, _ := current()
	select {
	case <-s.Exited:
		t.Fatalf("the server exited on its own: %v\n%s", s.WaitErr, s.Tail())
	default:
	}
	c := s.Dial(t, context.Background(), 3*time.Minute)
	defer c.Close()
	corrupted, unborn, checked := m.verifyAll(t, c)
	t.Logf("faults: %v", faults)
	t.Logf("turns %d, envs %d, envs lost %d (target 0), restore mismatches %d, states checked %d, corrupted %d (target 0), never committed %d",
		m.turns, m.envs, m.lost, m.mismatch, checked, corrupted, unborn)
	if m.lost > 0 || m.mismatch > 0 || corrupted > 0 {
		t.Errorf("envs lost %d, recovered envs not at their state %d, states corrupted %d", m.lost, m.mismatch, corrupted)
	}
}

// model is what each state id holds: the file's content and the
// variable, as the step that made it left them.
type model struct {
	mu                          sync.Mutex
	states                      map[string]string
	turns, envs, lost, mismatch int
	stateErrs                   []string
}

func (m *model) record(sid, content string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states[sid] = content
	m.turns++
}

func (m *model) count(f func()) { m.mu.Lock(); f(); m.mu.Unlock() }

// probe is the command whose output is an env's content.
const probe = "cat /f 2>/dev/null; echo v=$v"

// worker runs episodes until stopped: reset, steps, now and then a branch
// whose child is checked, or a rollback. A call that fails because the
// server went away re-dials; the env's first step after that must hold
// the state it was recovered at.
func (m *model) worker(t *testing.T, w int, rng *rand.Rand, current func() (*servetest.Server, int), stopped <-chan struct{}) {
	ctx := context.Background()
	var c *arbor.Client
	var gen = -1
	var env, content string
	var history []string // state ids of env's lineage, in order
	for {
		select {
		case <-stopped:
			return
		default:
		}
		s, g := current()
		if g != gen || c == nil {
			if c != nil {
				c.Close()
			}
			dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			var err error
			c, err = arbor.Dial(dctx, s.Addr, nil)
			cancel()
			if err != nil {
				time.Sleep(500 * time.Millisecond)
				continue
			}
			gen = g
		}
		if env == "" {
			r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
			if err != nil {
				c = nil
				time.Sleep(200 * time.Millisecond)
				continue
			}
			env, content, history = r.EnvID, "v=\n", []string{r.Info.StateID}
			m.record(r.Info.StateID, content)
			m.count(func() { m.envs++ })
		}
		switch op := rng.Intn(10); {
		case op < 7:
			n := rng.Intn(1000)
			res, err := c.Step(ctx, env, arbor.Bash(fmt.Sprintf("%s; echo %d >> /f; v=%d", probe, n, n), 30*time.Second))
			if err != nil {
				if errors.Is(err, arbor.ErrEnvLost) {
					m.count(func() { m.lost++ })
					env = ""
				} else if errors.Is(err, arbor.ErrUnknownEnv) {
					env = "" // closed by a restart before it was handed out
				} else {
					c = nil
				}
				continue
			}
			got := string(res.Obs.Stdout)
			if rec := res.Info.Recovered; rec != nil {
				m.mu.Lock()
				want, known := m.states[rec.StateID]
				m.mu.Unlock()
				if known && got != want {
					m.count(func() { m.mismatch++ })
					t.Errorf("worker %d: env %s recovered at %s holds %q, want %q", w, env, rec.StateID, got, want)
				}
				content = got
			} else if got != content {
				m.count(func() { m.mismatch++ })
				t.Errorf("worker %d: env %s holds %q before turn %d, want %q", w, env, got, res.Info.Turn, content)
				content = got
			}
			lines := strings.TrimSuffix(content, "v="+lastVar(content)+"\n")
			content = fmt.Sprintf("%s%d\nv=%d\n", lines, n, n)
			m.record(res.Info.StateID, content)
			history = append(history, res.Info.StateID)
		case op < 9:
			b, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 1})
			if err != nil || len(b.Errors) > 0 {
				if err == nil {
					c.CloseEnv(ctx, b.EnvIDs[0])
				}
				continue
			}
			res, err := c.Step(ctx, b.EnvIDs[0], arbor.Bash(probe, 30*time.Second))
			if err == nil && string(res.Obs.Stdout) != content && res.Info.Recovered == nil {
				m.count(func() { m.mismatch++ })
				t.Errorf("worker %d: branch of %s holds %q, want %q", w, env, res.Obs.Stdout, content)
			}
			c.CloseEnv(ctx, b.EnvIDs[0])
		default:
			if len(history) < 2 {
				continue
			}
			i := rng.Intn(len(history) - 1)
			if _, err := c.Rollback(ctx, env, history[i]); err == nil {
				m.mu.Lock()
				content = m.states[history[i]]
				m.mu.Unlock()
				history = history[:i+1]
			}
		}
	}
}

// lastVar is the variable's value in a content.
func lastVar(content string) string {
	i := strings.LastIndex(content, "v=")
	if i < 0 {
		return ""
	}
	return strings.TrimSuffix(content[i+2:], "\n")
}

// verifyAll branches every state the model knows and compares: a state
// that never committed (the server died first) answers unknown_state or
// checkpoint_failed and is counted apart.
func (m *model) verifyAll(t *testing.T, c *arbor.Client) (corrupted, unborn, checked int) {
	ctx := context.Background()
	m.mu.Lock()
	states := make(map[string]string, len(m.states))
	for k, v := range m.states {
		states[k] = v
	}
	m.mu.Unlock()
	for sid, want := range states {
		b, err := c.Branch(ctx, arbor.BranchParams{StateID: sid, N: 1})
		if err == nil && len(b.Errors) > 0 && b.Errors[0] != nil {
			err = b.Errors[0]
		}
		if err != nil {
			unborn++
			continue
		}
		checked++
		res, err := c.Step(ctx, b.EnvIDs[0], arbor.Bash(probe, 30*time.Second))
		if err != nil {
			corrupted++
			t.Errorf("state %s: branched, then %v", sid, err)
		} else if string(res.Obs.Stdout) != want {
			corrupted++
			t.Errorf("state %s holds %q, want %q", sid, res.Obs.Stdout, want)
		}
		c.CloseEnv(ctx, b.EnvIDs[0])
	}
	return corrupted, unborn, checked
}

// killCRIU kills the criu processes the server runs, and says how many.
// The private CRIU runs under its own loader (docs/install.md), so its
// command name is the loader's: it is told by its command line.
func killCRIU(server int) int {
	n := 0
	for _, pid := range childrenOf(server) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(b, []byte("criu")) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}
