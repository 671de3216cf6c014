package branch_test

import (
	"context"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/state"
)

// TestDeletedCwdWithNewDirAtItsPath: a process whose cwd was removed, with
// a new directory made at the same path, restores with both: the process
// in its deleted directory, the new directory (and what it holds) in the
// tree. CRIU's restore recreates a deleted directory at its old path and
// removes it once the process is in it; without help it took the new
// directory with it (docs/inspector.md, "What a restore brings back").
func TestDeletedCwdWithNewDirAtItsPath(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	e := r.e
	ctx := context.Background()
	for _, c := range []struct{ name, fill, want string }{
		{"empty new directory", "", ""},
		{"new directory with a file", "echo new > /work/d/f", "f\n"},
		// What the 5,000-turn fuzz run found next: another process holds
		// a file in the new directory, and the shell works in it.
		{"a file in it held, the shell in it", "echo h > /work/d/h && (exec sleep 1000 3</work/d/h) & sleep 0.2; cd /work/d", "h\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, _, err := e.NewEnv(ctx, "busybox")
			if err != nil {
				t.Fatal(err)
			}
			defer e.CloseEnv(ctx, env)
			run(t, e, env, "mkdir -p /work/d && (cd /work/d && exec sleep 1000) & sleep 0.3")
			run(t, e, env, "rmdir /work/d && mkdir /work/d && chmod 750 /work/d && "+orTrue(c.fill))
			before := run(t, e, env, probeDeletedCwd)
			if got := run(t, e, env, "ls /work/d"); got != c.want {
				t.Fatalf("live env: /work/d holds %q, want %q", got, c.want)
			}
			if !strings.Contains(before, "(deleted)") {
				t.Fatalf("the test needs the daemon in a deleted cwd: %q", before)
			}
			branchesMatch(t, e, env, probeDeletedCwd+"; ls /work/d", before+c.want)
			// The live env still has both too.
			if got := run(t, e, env, "ls /work/d"); got != c.want {
				t.Errorf("live env after the branch: /work/d holds %q, want %q", got, c.want)
			}
		})
	}
}

// probeDeletedCwd prints the daemon's cwd and the new directory's type and
// mode.
const probeDeletedCwd = `for p in $(pidof sleep); do readlink /proc/$p/cwd; readlink /proc/$p/fd/3; done | sort; pwd; stat -c '%F %a' /work/d; ls -la /work | grep -c ' d$'`

func orTrue(s string) string {
	if s == "" {
		return "true"
	}
	return s
}

// TestGhostInsideGhostDir: the shell's cwd is removed together with a
// file a daemon holds in it (rm -rf). CRIU lists the directory's ghost
// before the file's and, at the end of the restore, found the directory
// not empty and failed the restore (the 5,000-turn fuzz run); the restore
// now has it make and remove the file's ghost first.
func TestGhostInsideGhostDir(t *testing.T) {
	e, env := busyboxEnv(t)
	run(t, e, env, "mkdir -p /work/d0 && echo h >> /work/d0/h && { sleep 1000 3</work/d0/h </dev/null >/dev/null 2>&1 & }")
	run(t, e, env, "cd /work/d0 && rm -rf /work/d0")
	const probe = `readlink /proc/$$/cwd; p=$(pidof sleep); readlink /proc/$p/fd/3 | sed 's/[.]cr[.][0-9a-f]*[.]ghost//; s|^/work/\(h\)|/work/d0/\1|'; cat /proc/$p/fd/3; ls /work`
	before := run(t, e, env, probe)
	if !strings.Contains(before, "/work/d0 (deleted)") {
		t.Fatalf("the test needs the shell in a removed cwd: %q", before)
	}
	branchesMatch(t, e, env, probe, before)
}

// branchesMatch takes a full checkpoint of env, branches it twice and
// checks that probe prints want in each child.
func branchesMatch(t *testing.T, e *branch.Engine, env *branch.Env, probe, want string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	res, err := e.Branch(ctx, branch.Source{Env: env}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, ch := range res.Children {
		if res.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		if got := run(t, e, ch, probe); got != want {
			t.Errorf("child %d:\n%s\nwant (the live env):\n%s", i, got, want)
		}
		e.CloseEnv(ctx, ch)
	}
}

// TestRemovedFileLinkedElsewhere: the shell holds a file whose name was
// removed while a hard link at another name keeps it (ln; rm). CRIU
// refused the dump ("Can't create link remap ... Use link-remap option",
// the end of a 5,000-turn fuzz run); the dump now records the file by a
// link remap and the restore finds it under its other name, so that the
// child's descriptor is the same file as that name, as in the live env.
// Then the other name goes too: the next checkpoint dumps again (the
// file is a ghost now) and still restores.
func TestRemovedFileLinkedElsewhere(t *testing.T) {
	e, env := busyboxEnv(t)
	run(t, e, env, "mkdir -p /work /tmp && echo 0 > /tmp/t0 && exec 3>>/tmp/t0 && ln -f /tmp/t0 /work/f2 && rm -f /tmp/t0 && echo w >&3")
	// fd 3 and /work/f2 are one file (a copy would have its own inode),
	// and no link remap is left in /tmp.
	const probe = `readlink /proc/$$/fd/3; [ "$(stat -L -c %i /proc/$$/fd/3)" = "$(stat -c %i /work/f2)" ] && echo one file; cat /work/f2; stat -c '%h %s' /work/f2; ls /tmp | grep -c link_remap; true`
	before := run(t, e, env, probe)
	if !strings.Contains(before, "/tmp/t0 (deleted)\none file\n") {
		t.Fatalf("the test needs fd 3 on a removed file linked as /work/f2: %q", before)
	}
	branchesMatch(t, e, env, probe, before)
	run(t, e, env, "rm /work/f2 && echo v >&3")
	const probe2 = `readlink /proc/$$/fd/3; cat /proc/$$/fd/3; ls /work`
	branchesMatch(t, e, env, probe2, run(t, e, env, probe2))
}

// busyboxEnv is a new busybox env on its own engine and pool.
func busyboxEnv(t *testing.T) (*branch.Engine, *branch.Env) {
	t.Helper()
	dir := t.TempDir()
	e := newRig(t, newBtrfs(t, dir), dir, 0).e
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.CloseEnv(ctx, env) })
	return e, env
}
