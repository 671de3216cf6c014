package watch_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// rig is one sandbox on a btrfs clone, with "checkpoints" made of a btrfs
// snapshot (the filesystem artifact) and the inspector's baseline taken
// while the sandbox is frozen, where a real engine would run CRIU.
type rig struct {
	t    *testing.T
	ins  *watch.Inspector
	snap cr.Snapshotter
	env  *launch.Env
	last string // the last filesystem artifact
	n    int
}

func newRig(t *testing.T, ins *watch.Inspector) *rig {
	t.Helper()
	sandboxtest.RequireRoot(t)
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("btrfs-progs not installed: run make deps")
	}
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: t.TempDir(), PoolSize: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := snap.Unmount(context.Background()); err != nil {
			t.Error(err)
		}
	})
	quiet := slog.New(slog.DiscardHandler)
	l := &launch.Launcher{Snap: snap, Images: &image.Store{Snap: snap, Logger: quiet}, Logger: quiet, InitBinary: sandboxtest.InitBinary(t), AutoBuild: true}
	env, err := l.Launch(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close(context.Background()) })
	r := &rig{t: t, ins: ins, snap: snap, env: env}
	cg, err := env.Sandbox.CgroupID()
	if err != nil {
		t.Fatal(err)
	}
	if err := ins.Track(env.ID, cg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ins.Untrack(env.ID) })
	r.snapshot()
	if err := ins.Baseline(ctx, env.ID, r.target(""), nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) target(cmd string) inspector.Target {
	sb := r.env.Sandbox
	t := inspector.Target{Shell: sb, Cgroup: sb.FreezerCgroup(), LiveRoot: sb.Root(), Command: cmd}
	if r.last != "" {
		t.SnapshotRoot = r.snap.Path(r.last)
		last, vol := r.last, r.env.Volume
		t.Changes = func(ctx context.Context) ([]cr.Change, error) { return r.snap.Changes(ctx, last, vol) }
	}
	return t
}

func (r *rig) snapshot() {
	r.n++
	name := fmt.Sprintf("states/%s-%d", r.env.ID, r.n)
	if err := r.snap.Snapshot(context.Background(), r.env.Volume, name); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { r.snap.Destroy(context.Background(), name) })
	r.last = name
}

// checkpoint takes what kind says, as the engine would: frozen, artifact,
// baseline, thaw.
func (r *rig) checkpoint(kind state.Kind) {
	if kind == state.None {
		return
	}
	sb := r.env.Sandbox
	err := sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		if kind.Has(state.FS) {
			r.snapshot()
		}
		return r.ins.Checkpointed(r.env.ID, kind, r.target(""))
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// turn runs cmd as one turn and returns its classification.
func (r *rig) turn(cmd string) (inspector.Result, time.Duration) {
	ctx := context.Background()
	if err := r.ins.BeginTurn(r.env.ID); err != nil {
		r.t.Fatal(err)
	}
	res, err := r.env.Sandbox.Exec(ctx, cmd, sandbox.ExecOptions{Timeout: 20 * time.Second})
	if err != nil {
		r.t.Fatal(err)
	}
	if res.ExitCode != 0 && res.ExitCode != 1 {
		r.t.Errorf("%q exited %d (want 0 or 1: the turn did not run as written): %s%s", cmd, res.ExitCode, res.Stdout, res.Stderr)
	}
	start := time.Now()
	out, err := r.ins.EndTurn(ctx, r.env.ID, r.target(cmd))
	took := time.Since(start)
	if err != nil {
		r.t.Fatal(err)
	}
	return out, took
}

var order = map[state.Kind]int{state.None: 0, state.FS: 1, state.Proc: 1, state.Full: 2}

// covers reports whether got takes at least everything want does.
func covers(got, want state.Kind) bool {
	return got == want || got == state.Full || want == state.None
}

type turnCase struct {
	name, cmd string
	want      state.Kind
	// fallback is the class expected without eBPF, when it differs.
	fallback state.Kind
	// atLeast: any class covering want passes (background activity).
	atLeast bool
}

// suite is a session of turns, each checkpointed as classified.
var suite = []turnCase{
	{name: "ls", cmd: "ls -la / /work >/dev/null", want: state.None},
	{name: "cat and grep", cmd: "cat /etc/passwd >/dev/null; grep -r root /etc >/dev/null", want: state.None},
	{name: "find", cmd: "find / -xdev -name '*.conf' >/dev/null 2>&1", want: state.None},
	{name: "failing test run with temp files", cmd: "mkdir -p /tmp/run && echo data > /tmp/run/x && sh -c 'cat /tmp/run/x >/dev/null; exit 1'; rc=$?; rm -rf /tmp/run; unset rc; false", want: state.None},
	{name: "file edit", cmd: "echo hello > /work/a.txt", want: state.FS},
	{name: "directory tree", cmd: "mkdir -p /work/src/pkg/sub && echo 'package sub' > /work/src/pkg/sub/x.go", want: state.FS},
	{name: "create then delete", cmd: "echo tmp > /work/tmp.txt && mkdir /work/d && rm -r /work/tmp.txt /work/d", want: state.None},
	{name: "identical rewrite (a new mtime)", cmd: "echo hello > /work/a.txt && cp /work/a.txt /work/b && mv /work/b /work/a.txt", want: state.FS},
	{name: "metadata only", cmd: "touch -d '2001-02-03 04:05:06' /work/a.txt", want: state.FS},
	// A directory's mtime is compared only when a call set it (an entry
	// coming or going moves it too); without eBPF which call is unknown.
	{name: "a directory's times", cmd: "touch -d '2001-02-03 04:05:06' /work/src", want: state.FS, fallback: state.Proc},
	{name: "set again", cmd: "touch -d '2002-02-03 04:05:06' /work/src", want: state.FS, fallback: state.Proc},
	{name: "set to what they were", cmd: "touch -d '2003-02-03 04:05:06' /work/src && touch -d '2002-02-03 04:05:06' /work/src", want: state.None},
	{name: "shell opens a descriptor", cmd: "exec 3</etc/passwd", want: state.Proc},
	{name: "a child reads through it", cmd: "head -c 10 <&3 >/dev/null", want: state.Proc},
	{name: "shell closes it", cmd: "exec 3<&-", want: state.Proc},
	{name: "chmod", cmd: "chmod 600 /work/a.txt", want: state.FS},
	{name: "chmod back and forth", cmd: "chmod 644 /work/a.txt && chmod 600 /work/a.txt", want: state.None},
	{name: "cd", cmd: "cd /work", want: state.Proc},
	{name: "export", cmd: "export FOO=bar", want: state.Proc},
	{name: "function", cmd: "greet() { echo hi; }", want: state.Proc},
	{name: "alias", cmd: "alias ll='ls -l'", want: state.Proc},
	{name: "read-only after shell changes", cmd: "ll >/dev/null; greet >/dev/null; echo $FOO >/dev/null", want: state.None},
	{name: "idle background process", cmd: "sleep 1000 >/dev/null 2>&1 & sleep 0.1", want: state.Proc},
	{name: "idle process sleeps on", cmd: "ls /work >/dev/null", want: state.None, fallback: state.Proc},
	// A signal changes a process that does not run: its stopped state
	// (and pending signals) are sampled.
	{name: "stop the idle process", cmd: "kill -STOP %1", want: state.Proc},
	{name: "continue it", cmd: "kill -CONT %1", want: state.Proc},
	// Another process changes the idle one: its nice value, its
	// oom_score_adj (a write to /proc, which no snapshot holds: full with
	// eBPF; without, the sampled value changed), and the shell's hard
	// limit.
	{name: "renice the idle process", cmd: "renice -n 3 -p $! >/dev/null", want: state.Proc},
	{name: "its oom_score_adj", cmd: "echo 100 > /proc/$!/oom_score_adj", want: state.Full, fallback: state.Proc},
	{name: "a soft limit", cmd: "ulimit -S -c 1000", want: state.Proc},
	{name: "a hard limit alone", cmd: "ulimit -H -c 5000", want: state.Proc},
	// A file the shell holds changed by another name: the process image
	// records it, so the turn needs both parts.
	{name: "hold a file", cmd: "mkdir -p /work/hd && echo 1 > /work/hd/h && exec 6</work/hd/h", want: state.Full},
	{name: "empty it through ..", cmd: "(cd /work/hd && : > ../hd/h)", want: state.Full},
	{name: "change it through a hard link", cmd: "ln -f /work/hd/h /work/hd/k && echo 333 > /work/hd/k", want: state.Full},
	{name: "let it go", cmd: "exec 6<&-; rm -r /work/hd", want: state.Full},
	{name: "background server with a log", cmd: "sh -c 'while :; do echo tick >> /work/server.log; sleep 0.05; done' >/dev/null 2>&1 & sleep 0.1", want: state.Full},
	{name: "server keeps logging", cmd: "sleep 0.2", want: state.Full},
	{name: "stop the server", cmd: "kill %2; wait %2 2>/dev/null; true", want: state.Proc, atLeast: true},
	// Kernel state outside files and outside the sampled processes'
	// memory: another process's affinity and I/O priority, data queued
	// in a FIFO a sleeping process holds, taken from one the shell
	// holds. Signal 0 only probes.
	{name: "signal 0 probes", cmd: "kill -0 $$", want: state.None, fallback: state.Proc},
	{name: "another idle process", cmd: "sleep 2000 >/dev/null 2>&1 & IDLE=$!", want: state.Proc},
	{name: "its affinity", cmd: "taskset -p 1 $IDLE >/dev/null", want: state.Proc},
	{name: "its I/O priority", cmd: "ionice -c 3 -p $IDLE", want: state.Proc},
	{name: "a FIFO a sleeper holds", cmd: "mkfifo /work/q && sh -c 'exec 7<>/work/q; exec sleep 3000' >/dev/null 2>&1 & Q=$!; sleep 0.1", want: state.Full},
	{name: "data queued in it", cmd: "echo queued > /work/q", want: state.Proc, atLeast: true},
	{name: "the shell holds it too", cmd: "exec 8<>/work/q", want: state.Proc},
	// Through a descriptor already open: no open call names the FIFO,
	// the write itself does (its times move with the data).
	{name: "the shell writes into it", cmd: "echo more >&8", want: state.Full},
	{name: "a child takes data from it", cmd: "head -c 3 <&8 >/dev/null", want: state.Proc, atLeast: true},
	{name: "let them go", cmd: "exec 8<&-; kill $Q $IDLE; wait $Q $IDLE 2>/dev/null; rm /work/q; unset Q IDLE; true", want: state.Proc, atLeast: true},
	{name: "memory changer", cmd: "sh -c 'x=; while :; do x=\"$x.\"; sleep 0.05; done' >/dev/null 2>&1 &", want: state.Proc},
	{name: "memory changer runs on", cmd: "sleep 0.2", want: state.Proc},
	{name: "memory changer runs on again", cmd: "ls >/dev/null; sleep 0.1", want: state.Proc},
}

func runSuite(t *testing.T, ins *watch.Inspector) {
	r := newRig(t, ins)
	var total time.Duration
	misses := 0
	for _, tc := range suite {
		got, took := r.turn(tc.cmd)
		total += took
		want := tc.want
		if !ins.UsesBPF() {
			// Without eBPF nothing tells what a turn did to kernel
			// state outside files: every turn takes the processes.
			if tc.fallback != "" {
				want = tc.fallback
			}
			want = want.Join(state.Proc)
		}
		ok := got.Kind == want
		if tc.atLeast {
			ok = covers(got.Kind, want)
		}
		if !ok {
			t.Errorf("%s: %q classified %s, want %s; reasons %q", tc.name, tc.cmd, got.Kind, want, got.Reasons)
		} else {
			t.Logf("%s: %s %q (%v)", tc.name, got.Kind, got.Reasons, took)
		}
		// Verification: a turn that skipped the filesystem artifact must
		// leave the live tree equal to the last one.
		if !got.Kind.Has(state.FS) {
			diff, err := inspector.TreeDiff(context.Background(), r.env.Sandbox.Root(), r.snap.Path(r.last))
			if err != nil {
				t.Fatal(err)
			}
			if len(diff) > 0 {
				misses++
				t.Errorf("%s: classified %s but the tree differs from the last snapshot: %q", tc.name, got.Kind, diff)
			}
		}
		r.checkpoint(got.Kind)
	}
	t.Logf("verification: %d misses over %d turns", misses, len(suite))
	t.Logf("EndTurn took %v per turn on average", total/time.Duration(len(suite)))
}

// newEBPF is an Inspector with eBPF and options o (its logger quiet),
// closed when t ends.
func newEBPF(t *testing.T, o watch.Options) *watch.Inspector {
	t.Helper()
	o.Logger = slog.New(slog.DiscardHandler)
	ins, err := watch.New(o)
	if errors.Is(err, watch.ErrUnavailable) {
		t.Skipf("eBPF unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ins.Close() })
	return ins
}

func TestTurnsWithEBPF(t *testing.T) {
	runSuite(t, newEBPF(t, watch.Options{}))
}

func TestTurnsWithoutEBPF(t *testing.T) {
	ins := watch.NewFallback(watch.Options{Logger: slog.New(slog.DiscardHandler)})
	defer ins.Close()
	runSuite(t, ins)
}
