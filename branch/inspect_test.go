package branch_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// TestInspectorDrivenCheckpoints runs turns whose class the inspector
// decides, checkpoints each with that kind, and checks that every state
// restores to what was live at its turn.
func TestInspectorDrivenCheckpoints(t *testing.T) {
	c := requireCR(t)
	in := newInspector(t)
	dir := t.TempDir()
	snap := newBtrfs(t, dir)
	images := &image.Store{Snap: snap, Logger: quiet()}
	l := &launch.Launcher{Snap: snap, Images: images, InitBinary: sandboxtest.InitBinary(t), AutoBuild: true, Logger: quiet()}
	o := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, Inspector: in, Logger: quiet()}
	e, err := branch.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close(context.Background())
		unix.Unmount(filepath.Join(o.StateDir, "images", "hot"), unix.MNT_DETACH)
	})
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	turns := []struct {
		name, cmd string
		want      state.Kind
	}{
		{"read only", "ls / >/dev/null; cat /etc/passwd >/dev/null", state.None},
		{"file edit", "echo one > /work/a", state.FS},
		{"shell state", "cd /work; export K=v", state.Proc},
		{"create then delete", "echo tmp > /tmp/x; rm /tmp/x", state.None},
		// The content is the same, the modification time is not (make
		// would see it).
		{"identical rewrite", "echo one > /work/a", state.FS},
		{"both", "echo two > /work/b; cd /tmp", state.Full},
		{"metadata only", "touch -d '2001-02-03 04:05:06' /work/a", state.FS},
		{"shell opens a descriptor", "exec 3</etc/passwd", state.Proc},
		// Only the shared offset of the shell's descriptor moves.
		{"a child reads through it", "head -c 10 <&3 >/dev/null", state.Proc},
		{"shell closes it", "exec 3<&-", state.Proc},
	}
	// What the turns change, read without changing it: cwd, a variable,
	// two files, the mtime of one, the shell's fd 3 and its offset (when
	// the shell has no fd 3, $(...)'s pipe takes that number: a pipe's
	// inode differs after a restore and is dropped).
	const probe = `echo "$(pwd) $K $(cat /work/a /work/b 2>/dev/null | tr '\n' ,) $(stat -c %Y /work/a) $(readlink /proc/$$/fd/3 | sed 's/:\[[0-9]*\]//') $(grep pos /proc/$$/fdinfo/3 2>/dev/null | tr -d '\t')"`
	type ref struct{ sid, want string }
	var refs []ref
	for _, tt := range turns {
		run(t, e, env, tt.cmd)
		turn, err := e.Classify(ctx, env, tt.cmd)
		if err != nil {
			t.Fatal(err)
		}
		if turn.Kind != tt.want {
			t.Errorf("%s: classified %s (%v), want %s", tt.name, turn.Kind, turn.Reasons, tt.want)
		}
		sid, _, err := e.CheckpointAsync(env, turn.Kind)
		if err != nil {
			t.Fatal(err)
		}
		// Verification mode: the live state equals a restore of sid.
		v, err := e.Verify(ctx, env, sid)
		if err != nil {
			t.Fatalf("%s: verify: %v", tt.name, err)
		}
		if len(v.Misses) > 0 {
			t.Errorf("%s (%s): verification misses: %v", tt.name, turn.Kind, v.Misses)
		}
		live := run(t, e, env, probe)
		refs = append(refs, ref{sid, live})
	}
	if u, _ := e.Usage(); u.Coord.Verified != int64(len(turns)) || u.Coord.Misses != 0 {
		t.Errorf("verification counters: %+v", u.Coord)
	}
	// Verification catches a wrong "none": changes no checkpoint took.
	for _, miss := range []struct{ cmd, want string }{
		{"echo sneaky > /work/c", "file /work/c"},
		{"export Z=1", "shell state differs"},
		{"sleep 300 >/dev/null 2>&1 &", "process missing after restore"},
		{"exec 5</etc/passwd", "shell descriptors differ"},
		{"touch -d '2002-01-01' /work/a", "file /work/a"},
	} {
		run(t, e, env, miss.cmd)
		sid, _, err := e.CheckpointAsync(env, state.None)
		if err != nil {
			t.Fatal(err)
		}
		v, err := e.Verify(ctx, env, sid)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(v.Misses, "\n"), miss.want) {
			t.Errorf("%q skipped: verification found %v, want a miss naming %q", miss.cmd, v.Misses, miss.want)
		}
		if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range refs {
		res, err := e.Branch(ctx, branch.Source{State: r.sid}, 1)
		if err != nil || res.Errors[0] != nil {
			t.Fatalf("turn %d: branch: %v %v", i, err, res.Errors)
		}
		got := run(t, e, res.Children[0], probe)
		if got != r.want {
			t.Errorf("turn %d (%s): restored %q, live was %q", i, turns[i].name, got, r.want)
		}
		e.CloseEnv(ctx, res.Children[0])
	}
}

// newInspector is the eBPF inspector, or the fallback where eBPF is
// unavailable (as branchtest's rig does), closed with the test.
func newInspector(t testing.TB) *watch.Inspector {
	t.Helper()
	in, err := watch.New(watch.Options{Logger: quiet()})
	if errors.Is(err, watch.ErrUnavailable) {
		t.Logf("eBPF unavailable (%v): fallback inspector", err)
		in = watch.NewFallback(watch.Options{Logger: quiet()})
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}
