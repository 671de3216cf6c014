package manifest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/state"
)

// crashHelperEnv, when set to a directory, turns the test binary into the
// crash helper: a checkpoint loop that the test kills with SIGKILL.
const crashHelperEnv = "ARBOR_MANIFEST_CRASH_HELPER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashHelperEnv); dir != "" {
		if err := crashHelper(dir); err != nil {
			fmt.Fprintln(os.Stderr, "crash helper:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashHelper follows the engine's protocol in a loop, on the manifest in
// dir and artifact files in dir/art: intent, file, commit; every fifth turn
// a rollback that releases the abandoned state, then a GC pass (files
// first, then Forget). It announces "commit ID" after each commit returns
// and "release ID" before each release, on stdout.
func crashHelper(dir string) error {
	m, err := Open(filepath.Join(dir, "manifest.db"), Options{LockTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer m.Close()
	env, err := m.GetEnv("e")
	if errors.Is(err, ErrNotFound) {
		env = Env{ID: "e", Image: "debian"}
		err = m.PutEnv(env)
	}
	if err != nil {
		return err
	}
	// What an owner needs to adopt the env again after a restart.
	if err := m.SetLabels("e", map[string]string{"owner": "helper", "pid": fmt.Sprint(os.Getpid())}); err != nil {
		return err
	}
	art := filepath.Join(dir, "art")
	say := func(verb, id string) {
		fmt.Fprintf(os.Stdout, "%s %s\n", verb, id)
	}
	begin := func(id string, k ArtifactKind) error {
		if err := m.BeginArtifact(Artifact{ID: id, Kind: k, Location: id}); err != nil {
			return err
		}
		// Written in two steps so a kill can leave a partial file.
		f, err := os.Create(filepath.Join(art, id))
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteString(strings.Repeat("x", 512)); err != nil {
			return err
		}
		if _, err := f.WriteString(strings.Repeat("y", 512)); err != nil {
			return err
		}
		return m.SetArtifactBytes(id, 1024)
	}
	kinds := []state.Kind{state.Full, state.FS, state.Proc, state.None}
	deadline := time.Now().Add(30 * time.Second) // never outlive a test that forgot to kill us
	for i := 0; time.Now().Before(deadline); i++ {
		var parent State
		if env.Head != "" {
			if parent, err = m.GetState(env.Head); err != nil {
				return err
			}
		}
		s := State{ID: fmt.Sprintf("s%d-%d", os.Getpid(), i), Env: "e", Parent: parent.ID,
			Turn: parent.Turn + 1, Kind: kinds[i%len(kinds)], FS: parent.FS, Proc: parent.Proc}
		if parent.ID == "" {
			s.Kind = state.Full
		}
		var ready []string
		if s.Kind == state.FS || s.Kind == state.Full {
			s.FS = "fs-" + s.ID
			ready = append(ready, s.FS)
			if err := begin(s.FS, ArtifactFS); err != nil {
				return err
			}
		}
		if s.Kind == state.Proc || s.Kind == state.Full {
			s.Proc = "proc-" + s.ID
			ready = append(ready, s.Proc)
			if err := begin(s.Proc, ArtifactProc); err != nil {
				return err
			}
		}
		if err := m.CommitState(s, ready...); err != nil {
			return err
		}
		say("commit", s.ID)
		env.Head = s.ID
		if i%5 == 4 && s.Parent != "" {
			// Roll back one turn and drop the abandoned state.
			if err := m.SetHead("e", s.Parent); err != nil {
				return err
			}
			env.Head = s.Parent
			say("release", s.ID)
			if err := m.Release(s.ID); err != nil {
				return err
			}
			gs, ga, err := m.Garbage()
			if err != nil {
				return err
			}
			var stateIDs, artIDs []string
			for _, g := range gs {
				stateIDs = append(stateIDs, g.ID)
			}
			for _, a := range ga {
				if err := os.Remove(filepath.Join(art, a.Location)); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
				artIDs = append(artIDs, a.ID)
			}
			if err := m.ForgetWith(Policy{}, stateIDs, artIDs); err != nil {
				return err
			}
		}
	}
	return nil
}

// runCrashHelper starts the helper, kills it with SIGKILL a random moment
// after its first commit, and returns what it announced.
func runCrashHelper(t *testing.T, dir string, rng *rand.Rand) (committed, released []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	var timer <-chan time.Time
	killed := false
	for lines != nil {
		select {
		case l, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			verb, id, _ := strings.Cut(l, " ")
			switch verb {
			case "commit":
				committed = append(committed, id)
				if timer == nil {
					timer = time.After(time.Duration(rng.IntN(300)) * time.Millisecond)
				}
			case "release":
				released = append(released, id)
			}
		case <-timer:
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
			timer = nil
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("helper exited by itself: %v\n%s", err, stderr.String())
	}
	return committed, released
}

func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test re-executes the test binary")
	}
	dir := t.TempDir()
	art := filepath.Join(dir, "art")
	if err := os.Mkdir(art, 0o755); err != nil {
		t.Fatal(err)
	}
	exists := func(a Artifact) bool {
		_, err := os.Stat(filepath.Join(art, a.Location))
		return err == nil
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	wanted := map[string]bool{} // committed and never released
	for round := range 8 {
		committed, released := runCrashHelper(t, dir, rng)
		for _, id := range committed {
			wanted[id] = true
		}
		for _, id := range released {
			delete(wanted, id)
		}
		t.Logf("round %d: %d commits, %d releases announced", round, len(committed), len(released))

		m, err := Open(filepath.Join(dir, "manifest.db"), Options{Exists: exists})
		if err != nil {
			t.Fatal(err)
		}
		// Before recovery: every committed state is there with ready
		// artifacts, and so is every state at all (CommitState's promise).
		for id := range wanted {
			if _, err := m.GetState(id); err != nil {
				t.Errorf("round %d: committed state lost: %v", round, err)
			}
		}
		checkStatesReady(t, m)
		if u, err := m.Usage(); err == nil {
			t.Logf("round %d: before recover: %+v", round, u)
		}

		rep, err := m.Recover()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: recover: %d half-written, %d missing, %d states removed",
			round, len(rep.HalfWritten), len(rep.Missing), len(rep.RemovedStates))
		for _, a := range rep.HalfWritten {
			if err := os.Remove(filepath.Join(art, a.Location)); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		for _, id := range rep.RemovedStates {
			if wanted[id] {
				t.Errorf("round %d: recover removed wanted state %s", round, id)
			}
		}

		// After recovery: no intents, every record has its file and every
		// file its record, every state's artifacts exist, the head's
		// lineage runs back to a root.
		as, err := m.Artifacts()
		if err != nil {
			t.Fatal(err)
		}
		recorded := map[string]bool{}
		for _, a := range as {
			recorded[a.Location] = true
			if !a.Ready || !exists(a) {
				t.Errorf("round %d: artifact %+v after recover", round, a)
			}
		}
		files, _ := os.ReadDir(art)
		for _, f := range files {
			if !recorded[f.Name()] {
				t.Errorf("round %d: file %s has no record", round, f.Name())
			}
		}
		checkStatesReady(t, m)
		env, err := m.GetEnv("e")
		if err != nil {
			t.Fatal(err)
		}
		// The env stays open with its owner's labels: its head is what a
		// restarted engine restores.
		if env.Closed || env.Labels["owner"] != "helper" || env.Labels["pid"] == "" {
			t.Errorf("round %d: env after recover: closed %v labels %v", round, env.Closed, env.Labels)
		}
		line, err := m.Lineage(env.Head)
		if err != nil {
			t.Fatal(err)
		}
		if line[0].Parent != "" {
			t.Errorf("round %d: lineage of head %s starts at %s, whose parent %s is gone", round, env.Head, line[0].ID, line[0].Parent)
		}
		if rep, err := m.Recover(); err != nil || len(rep.HalfWritten)+len(rep.Missing)+len(rep.RemovedStates) != 0 {
			t.Errorf("round %d: second recover %+v %v", round, rep, err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(wanted) == 0 {
		t.Error("no state committed in any round")
	}
}

// checkStatesReady checks that every state's artifacts are recorded ready.
func checkStatesReady(t *testing.T, m *Manifest) {
	t.Helper()
	env, err := m.GetEnv("e")
	if err != nil {
		t.Fatal(err)
	}
	ss, err := m.States(env.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		for _, id := range []string{s.FS, s.Proc} {
			if id == "" {
				continue
			}
			if a, err := m.GetArtifact(id); err != nil || !a.Ready {
				t.Errorf("state %s: artifact %s: %+v %v", s.ID, id, a, err)
			}
		}
	}
}
