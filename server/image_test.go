package server_test

import (
	"archive/tar"
	"context"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image/registrytest"
	"github.com/arbor-env/arbor/server"
)

// TestPulledImageEpisode: a task whose image is a registry reference (a
// real registry on loopback) is pulled on first use and runs a whole
// episode through the server: the image's env, working dir and non-root
// user hold in the shell, in branched children and after a rollback;
// turns of every checkpoint kind; evaluate. (On ZFS: ARBOR_TEST_BACKEND=zfs;
// make test leaves it out of its ZFS subset, see the Makefile.)
func TestPulledImageEpisode(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	reg := registrytest.Start(t, registrytest.Options{})
	app := registrytest.Layer(t,
		registrytest.File{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"},
		registrytest.File{Name: "etc/group", Body: "root:x:0:\napp:x:1000:\n"},
		registrytest.File{Name: "home/app/", Type: tar.TypeDir, Uid: 1000, Gid: 1000},
		registrytest.File{Name: "work/", Type: tar.TypeDir, Uid: 1000, Gid: 1000},
		registrytest.File{Name: "work/n", Body: "0\n", Uid: 1000, Gid: 1000},
		registrytest.File{Name: "grader/answer", Body: "3\n", Mode: 0o600},
	)
	img := registrytest.Image(t, v1.Config{Env: []string{"APP_MODE=oci", "PATH=/usr/local/bin:/usr/bin:/bin"}, WorkingDir: "/work", User: "app"},
		registrytest.BusyboxLayer(t), app)
	ref := reg.Ref("envs/count:v1")
	digest := reg.Push(t, "envs/count:v1", img)

	ctx := context.Background()
	task := envpool.Task{Name: "oci-count", Image: ref, Instruction: "Raise /work/n to 3.",
		Verifier: `n=$(cat /work/n); if [ "$n" -ge 3 ]; then echo 1; else echo 0; fi`, MaxTurns: 40}
	p, err := envpool.NewPool(ctx, engine, []envpool.Task{task}, envpool.PoolOptions{Logger: quiet()})
	if err != nil {
		t.Fatalf("prepare a task on %s: %v", ref, err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Classify: engine.Classify, Tasks: coordinator.FromEnvpool(p)})
	c := dial(t, addr, nil)

	reset, err := c.Reset(ctx, arbor.ResetParams{Task: task.Name})
	if err != nil {
		t.Fatal(err)
	}
	env := reset.EnvID
	defer c.CloseEnv(ctx, env)
	who := "id -u; id -g; pwd; echo $APP_MODE $HOME"
	const wantWho = "1000\n1000\n/work\noci /home/app"
	if got := strings.TrimSpace(string(sh(t, c, env, who).Obs.Stdout)); got != wantWho {
		t.Errorf("the shell on the pulled image: %q, want %q", got, wantWho)
	}
	// The image's user is not root: the grader's file stays closed.
	if r, err := c.Step(ctx, env, arbor.Bash("cat /grader/answer", 10*time.Second)); err != nil || r.Obs.ExitCode == 0 {
		t.Errorf("the non-root agent read a root-only file: %+v %v", r, err)
	}

	turns := []struct{ cmd, kind string }{
		{"echo 1 > /work/n", "fs"},
		{"cat /work/n", "none"},
		{"export K=kept; cd /work", "proc"},
		{"sleep 1000 & echo 2 > /work/n", "full"},
	}
	states := map[string]string{}
	for _, tt := range turns {
		r := sh(t, c, env, tt.cmd)
		if r.Info.Checkpoint != tt.kind {
			t.Errorf("%q: checkpoint %s, want %s", tt.cmd, r.Info.Checkpoint, tt.kind)
		}
		states[tt.kind] = r.Info.StateID
	}
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 2})
	if err != nil || len(br.EnvIDs) != 2 || len(br.Errors) > 0 {
		t.Fatalf("branch: %+v %v", br, err)
	}
	for _, kid := range br.EnvIDs {
		got := strings.TrimSpace(string(sh(t, c, kid, who+"; echo $K; cat /work/n; ps -o comm | grep -q '^sleep$' && echo bg").Obs.Stdout))
		if want := wantWho + "\nkept\n2\nbg"; got != want {
			t.Errorf("child %s: %q, want %q", kid, got, want)
		}
		c.CloseEnv(ctx, kid)
	}
	if _, err := c.Rollback(ctx, env, states["fs"]); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(sh(t, c, env, who+"; cat /work/n").Obs.Stdout)); got != wantWho+"\n1" {
		t.Errorf("after the rollback: %q", got)
	}
	ev, err := c.Evaluate(ctx, env)
	if err != nil || ev.Reward != 0 {
		t.Errorf("evaluate at n=1: %+v %v, want 0", ev, err)
	}
	sh(t, c, env, "echo 3 > /work/n")
	if ev, err := c.Evaluate(ctx, env); err != nil || ev.Reward != 1 {
		t.Errorf("evaluate at n=3: %+v %v, want 1", ev, err)
	}

	// The pulled image is pinned by digest: a tag moved in the registry
	// changes nothing here until the image is pulled again.
	reg.Push(t, "envs/count:v1", registrytest.Image(t, v1.Config{}, registrytest.BusyboxLayer(t)))
	in, err := images.Resolve(ctx, ref, true, nil)
	if err != nil || in.Digest != digest {
		t.Errorf("the tag resolves to %s (%v) after it moved in the registry, want the pulled %s", in.Digest, err, digest)
	}
}
