package escape_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/escape"
	"github.com/arbor-env/arbor/state"
)

// buildProbe builds the probe as a static binary.
func buildProbe(t *testing.T) []byte {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	out := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-o", out, "./probe")
	cmd.Dir = filepath.Dir(file)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v: %s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// probeEnv is what the probe is told about the host.
type probeEnv struct {
	hostPaths []string
	marker    string
}

func (p probeEnv) command() string {
	var st unix.Stat_t
	dev := ""
	if unix.Stat("/", &st) == nil {
		dev = fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	return fmt.Sprintf("ESCAPE_HOST_DEV=%s ESCAPE_HOST_PID=%d ESCAPE_HOST_PATHS='%s' ESCAPE_MARKER='%s' /.escape-probe",
		dev, os.Getpid(), strings.Join(p.hostPaths, ":"), p.marker)
}

// install puts the probe into a sandbox's root.
func install(t *testing.T, probe []byte, root string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, ".escape-probe"), probe, 0o755); err != nil {
		t.Fatal(err)
	}
}

// results runs the probe through exec and checks that it attempted every
// route exactly once.
func results(t *testing.T, where string, exec func(cmd string) (*sandbox.Result, error), pe probeEnv) map[string]escape.Result {
	t.Helper()
	res, err := exec(pe.command())
	if err != nil {
		t.Fatalf("%s: run probe: %v", where, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%s: probe exited %d: %s", where, res.ExitCode, res.Stderr)
	}
	rs, err := escape.Parse(res.Stdout)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	got := map[string]escape.Result{}
	for _, r := range rs {
		if _, dup := got[r.Route]; dup {
			t.Fatalf("%s: route %s reported twice", where, r.Route)
		}
		got[r.Route] = r
	}
	for _, r := range escape.Routes {
		if _, ok := got[r.Name]; !ok {
			t.Fatalf("%s: probe did not report route %s", where, r.Name)
		}
	}
	return got
}

func requireBlocked(t *testing.T, where string, got map[string]escape.Result) {
	t.Helper()
	for _, r := range escape.Routes {
		g := got[r.Name]
		if g.Verdict != escape.Blocked {
			t.Errorf("%s: route %s is OPEN: %s", where, r.Name, g.Detail)
		} else {
			t.Logf("%s: %s blocked: %s", where, r.Name, g.Detail)
		}
	}
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// TestEscapeSuite attempts every route as root inside a started sandbox
// and inside a child branched from it: every route must be blocked.
func TestEscapeSuite(t *testing.T) {
	r := branchtest.ForTest(t, branchtest.Options{})
	probe := buildProbe(t)
	ctx := context.Background()
	e := r.Engine

	victim, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, victim)
	marker := randomName("escape-marker-")
	if res, err := e.Exec(ctx, victim, "touch /tmp/"+marker, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("plant marker: %v %+v", err, res)
	}

	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, env)
	install(t, probe, env.Sandbox().Root())
	wd, _ := os.Getwd()
	pe := probeEnv{hostPaths: []string{r.Dir, victim.Sandbox().Root(), wd}, marker: marker}
	run := func(env *branch.Env) func(string) (*sandbox.Result, error) {
		return func(cmd string) (*sandbox.Result, error) {
			return e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: 60 * time.Second})
		}
	}
	requireBlocked(t, "started", results(t, "started", run(env), pe))

	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	br, err := e.Branch(ctx, branch.Source{Env: env}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, child := range br.Children {
		if br.Errors[i] != nil {
			t.Fatalf("branch child %d: %v", i, br.Errors[i])
		}
		defer e.CloseEnv(ctx, child)
		where := fmt.Sprintf("branched child %d", i)
		requireBlocked(t, where, results(t, where, run(child), pe))
	}
}

// TestEscapeProbeSeesHoles runs the probe in a sandbox started without
// hardening, on the same backend: the routes that only the hardening closes
// must be open there, which shows that the probe notices a hole when there
// is one.
func TestEscapeProbeSeesHoles(t *testing.T) {
	r := branchtest.ForTest(t, branchtest.Options{Isolation: sandbox.Isolation{Unhardened: true}})
	probe := buildProbe(t)
	ctx := context.Background()
	env, _, err := r.Engine.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Engine.CloseEnv(ctx, env)
	install(t, probe, env.Sandbox().Root())
	got := results(t, "unhardened", func(cmd string) (*sandbox.Result, error) {
		return r.Engine.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: 60 * time.Second})
	}, probeEnv{})
	for _, r := range escape.Routes {
		g := got[r.Name]
		want := escape.Blocked
		if r.OpenUnhardened {
			want = escape.Open
			if r.HostFile != "" {
				if _, err := os.Stat(r.HostFile); err != nil {
					want = escape.Blocked
				}
			}
		}
		if g.Verdict != want {
			t.Errorf("unhardened: route %s is %s, want %s: %s", r.Name, g.Verdict, want, g.Detail)
		}
	}
}
