package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// crRig is CRIU and a btrfs pool for dump/restore tests of sandboxes.
type crRig struct {
	c    *criu.Checkpointer
	snap *btrfs.Snapshotter
	n    int
}

func newCRRig(t *testing.T) *crRig {
	t.Helper()
	sandboxtest.RequireRoot(t)
	c, err := criu.New("", slog.New(slog.DiscardHandler))
	if errors.Is(err, cr.ErrUnavailable) {
		t.Skipf("criu 4.x not installed: run make deps (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("btrfs-progs not installed: run make deps")
	}
	snap, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: t.TempDir(), PoolSize: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snap.Unmount(context.Background()) })
	return &crRig{c: c, snap: snap}
}

// start boots a busybox sandbox on a fresh volume.
func (r *crRig) start(t *testing.T, iso sandbox.Isolation) (*sandbox.Sandbox, string) {
	t.Helper()
	return r.startCfg(t, sandbox.Config{Isolation: iso})
}

// startCfg is start with cfg's Isolation, Shell and UserNS (the volume is
// shifted to the range).
func (r *crRig) startCfg(t *testing.T, cfg sandbox.Config) (*sandbox.Sandbox, string) {
	t.Helper()
	ctx := context.Background()
	r.n++
	vol := fmt.Sprintf("src%d", r.n)
	if err := r.snap.CreateVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	root := sandboxtest.BusyboxRoot(t, "")
	if out, err := exec.Command("cp", "-a", root+"/.", r.snap.Path(vol)).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if u := cfg.UserNS.WithDefaults(); u.Enabled {
		sandboxtest.ShiftRoot(t, r.snap.Path(vol), u.HostID, u.Size)
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: fmt.Sprintf("iso-%d-%s", os.Getpid(), vol), Root: r.snap.Path(vol),
		InitBinary: sandboxtest.InitBinary(t), Isolation: cfg.Isolation, Shell: cfg.Shell, UserNS: cfg.UserNS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	return sb, vol
}

// dump snapshots vol and dumps sb as the engine does (the isolation
// record next to the images); it returns the snapshot and image dir.
func (r *crRig) dump(t *testing.T, sb *sandbox.Sandbox, vol string) (string, string) {
	t.Helper()
	ctx := context.Background()
	snapName := vol + "-snap"
	imgs := t.TempDir()
	err := sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		if err := r.snap.Snapshot(ctx, vol, snapName); err != nil {
			return err
		}
		rec, err := sb.Isolation()
		if err != nil {
			return err
		}
		if err := sandbox.WriteIsolationRecord(imgs, rec); err != nil {
			return err
		}
		_, err = r.c.Dump(ctx, criu.DumpRequest{PID: sb.InitPID(), Dir: imgs, FreezeCgroup: sb.FreezerCgroup(), UserNS: sb.UserNS().Enabled})
		return err
	})
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	return snapName, imgs
}

// restore clones snapName and restores imgs into it with the record rec.
func (r *crRig) restore(t *testing.T, snapName, imgs string, rec sandbox.IsolationRecord, policy sandbox.Isolation) (*sandbox.Sandbox, string, error) {
	t.Helper()
	return r.restoreCfg(t, snapName, imgs, rec, sandbox.Config{Isolation: policy})
}

// restoreCfg is restore with cfg's Isolation (the policy) and UserNS.
func (r *crRig) restoreCfg(t *testing.T, snapName, imgs string, rec sandbox.IsolationRecord, cfg sandbox.Config) (*sandbox.Sandbox, string, error) {
	t.Helper()
	ctx := context.Background()
	r.n++
	vol := fmt.Sprintf("child%d", r.n)
	if err := r.snap.Clone(ctx, snapName, vol); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("iso-%d-%s", os.Getpid(), vol)
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: id, Root: r.snap.Path(vol), Isolation: cfg.Isolation, UserNS: cfg.UserNS}, rec, func(join func(int) error) (int, error) {
		return r.c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: r.snap.Path(vol), Join: join, UserNS: cfg.UserNS.Enabled})
	})
	if err == nil {
		t.Cleanup(func() { child.Destroy(context.Background()) })
	}
	return child, id, err
}

// inside is what a sandbox says about its own hardening: the isolation
// fields of init and of the shell, and its mount points.
func inside(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()
	r := run(t, sb, "grep -E 'Cap|NoNewPrivs|Seccomp' /proc/1/status /proc/self/status; awk '{print $5, $6}' /proc/self/mountinfo | sort", 5*time.Second)
	if r.ExitCode != 0 {
		t.Fatalf("inside: %+v", r)
	}
	return string(r.Stdout)
}

// TestRestoreKeepsHardening: a dump and restore of a hardened sandbox
// (its seccomp filter, capabilities, no_new_privs and /proc masks) gives a
// child that holds exactly what its parent held, and passes Restore's
// check; so does one started with fewer capabilities.
func TestRestoreKeepsHardening(t *testing.T) {
	r := newCRRig(t)
	fewer := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL"}
	for _, tt := range []struct {
		name string
		iso  sandbox.Isolation
	}{{"default", sandbox.Isolation{}}, {"fewer caps", sandbox.Isolation{Caps: fewer}}} {
		t.Run(tt.name, func(t *testing.T) {
			sb, vol := r.start(t, tt.iso)
			want := inside(t, sb)
			snapName, imgs := r.dump(t, sb, vol)
			rec, err := sandbox.ReadIsolationRecord(imgs)
			if err != nil {
				t.Fatal(err)
			}
			child, _, err := r.restore(t, snapName, imgs, rec, sandbox.Isolation{})
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if got := inside(t, child); got != want {
				t.Fatalf("child:\n%s\nparent:\n%s", got, want)
			}
			for _, cmd := range []string{"mount -t tmpfs x /mnt", "v=$(cat /proc/sys/kernel/core_pattern); printf '%s\\n' \"$v\" >/proc/sys/kernel/core_pattern", "unshare -U true"} {
				if res := run(t, child, "mkdir -p /mnt; "+cmd, 5*time.Second); res.ExitCode == 0 {
					t.Errorf("restored child: %q succeeded", cmd)
				}
			}
		})
	}
}

// TestRestoreRefusesMismatch: Restore compares what comes back with the
// dump's record and refuses (ErrIsolation) when they differ, destroying the
// child; a record the policy does not allow is refused before CRIU runs.
func TestRestoreRefusesMismatch(t *testing.T) {
	r := newCRRig(t)
	sb, vol := r.start(t, sandbox.Isolation{})
	snapName, imgs := r.dump(t, sb, vol)
	good, err := sandbox.ReadIsolationRecord(imgs)
	if err != nil {
		t.Fatal(err)
	}
	fewer, _ := sandbox.ParseCaps([]string{"CAP_CHOWN", "CAP_KILL"})
	tests := []struct {
		name   string
		tamper func(rec *sandbox.IsolationRecord)
		policy sandbox.Isolation
	}{
		// Within the policy, but not what the processes hold: the
		// comparison after the restore catches it.
		{"expects fewer caps", func(rec *sandbox.IsolationRecord) {
			rec.Caps = fewer
			rec.Init.CapInh, rec.Init.CapPrm, rec.Init.CapEff, rec.Init.CapBnd = fewer, fewer, fewer, fewer
			rec.Shell = rec.Init
		}, sandbox.Isolation{}},
		{"expects a second filter", func(rec *sandbox.IsolationRecord) { rec.Init.SeccompFilters, rec.Shell.SeccompFilters = 2, 2 }, sandbox.Isolation{}},
		{"expects another shell", func(rec *sandbox.IsolationRecord) { rec.ShellPID += 100 }, sandbox.Isolation{}},
		// Outside the policy: refused up front.
		{"unhardened record", func(rec *sandbox.IsolationRecord) { rec.Hardened = false }, sandbox.Isolation{}},
		{"caps beyond the default", func(rec *sandbox.IsolationRecord) { rec.Caps |= 1 << 21 }, sandbox.Isolation{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := good
			tt.tamper(&rec)
			child, id, err := r.restore(t, snapName, imgs, rec, tt.policy)
			if !errors.Is(err, sandbox.ErrIsolation) {
				if child != nil {
					child.Destroy(context.Background())
				}
				t.Fatalf("restore with a tampered record: %v, want ErrIsolation", err)
			}
			t.Logf("refused: %v", err)
			for _, d := range []string{"/sys/fs/cgroup/unified/arbor/" + id, "/sys/fs/cgroup/pids/arbor/" + id, "/sys/fs/cgroup/devices/arbor/" + id} {
				if _, err := os.Stat(d); err == nil {
					t.Errorf("refused restore left %s behind", filepath.Clean(d))
				}
			}
		})
	}
	t.Run("the untampered record passes", func(t *testing.T) {
		if _, _, err := r.restore(t, snapName, imgs, good, sandbox.Isolation{}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestKillAllButInitAfterRestore: in a restored sandbox the pid allocator
// starts low again (CRIU gives each restored task its pid with set_tid),
// so the shell init starts after KillAllButInit can get the killed
// shell's pid. KillAllButInit must still take it for the new shell; it
// used to wait 30 s for another pid and fail, which made an evaluate's
// verifier fork fail (sandbox_failed) and the episode masked.
func TestKillAllButInitAfterRestore(t *testing.T) {
	r := newCRRig(t)
	sb, vol := r.start(t, sandbox.Isolation{})
	// Put the shell's pid above where the restored allocator starts: a
	// few forks, then a shell that init replaces.
	run(t, sb, "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done", 10*time.Second)
	if res := run(t, sb, "exit 3", 20*time.Second); !res.ShellRestarted {
		t.Fatalf("exit 3: restarted=%v", res.ShellRestarted)
	}
	snapName, imgs := r.dump(t, sb, vol)
	rec, err := sandbox.ReadIsolationRecord(imgs)
	if err != nil {
		t.Fatal(err)
	}
	child, _, err := r.restore(t, snapName, imgs, rec, sandbox.Isolation{})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	pid := func(cmd string) int {
		t.Helper()
		out := strings.TrimSpace(string(run(t, child, cmd, 10*time.Second).Stdout))
		p, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("%q printed %q, want a pid", cmd, out)
		}
		return p
	}
	shell := pid("echo $$")
	// Walk the allocator up to the pid just below the shell's: the next
	// task made once the shell is gone gets the shell's pid.
	for p := pid("sh -c 'echo $$'"); p != shell-1; p = pid("sh -c 'echo $$'") {
		if p >= shell {
			t.Fatalf("a new task got pid %d, the shell has %d: the restored allocator no longer starts below the shell, so this test no longer makes init reuse the shell's pid", p, shell)
		}
	}
	start := time.Now()
	if _, err := child.KillAllButInit(context.Background()); err != nil {
		t.Fatalf("KillAllButInit after %v: %v", time.Since(start), err)
	}
	if got := pid("echo $$"); got != shell {
		t.Fatalf("the new shell has pid %d, the killed one had %d: the test did not make init reuse the pid", got, shell)
	}
}

// TestRestoreKeepsShellConfig: a sandbox whose shell runs as an image's
// non-root user, dumped and restored (by a Restore that is given no shell
// config), has that user's shell with its environment and directory, a
// terminal still exclusive, and init starts the shell that replaces it
// the same way: the config lives in init's memory. One case keeps no
// CAP_DAC_OVERRIDE, so init cannot open the user's terminal by path.
//
// CRIU reads every task's rlimits with prlimit, which for a task of
// another uid needs CAP_SYS_RESOURCE over the task's user namespace. In
// user namespace mode the server owns that namespace and so has it; with
// host ids it needs the capability itself, which some hosts' root lacks
// (this VM's, some CI containers): there the dump must fail cleanly,
// leaving the sandbox running (docs/sandbox.md, "The shell's user,
// environment and directory").
func TestRestoreKeepsShellConfig(t *testing.T) {
	r := newCRRig(t)
	// What the shell reports of itself, and whether another open of its
	// terminal succeeds (the terminal must be exclusive). The open is in
	// a non-interactive sh: a subshell of the interactive ash waits for
	// input after a redirection fails.
	const state = userStateCmd + `; t=$(for f in /proc/$$/fd/*; do readlink "$f"; done | grep '^/dev/pts/' | sort -u); sh -c ': <>"$1"' sh "$t" 2>/dev/null && echo terminal open || echo terminal busy`
	const want = userState + "terminal busy\n"
	userNS := sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	noDAC := sandbox.Isolation{Caps: []string{"CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}}
	for _, tt := range []struct {
		name string
		cfg  sandbox.Config
	}{
		{"user namespace mode", sandbox.Config{UserNS: userNS}},
		{"user namespace mode, no CAP_DAC_OVERRIDE", sandbox.Config{UserNS: userNS, Isolation: noDAC}},
		{"host ids", sandbox.Config{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Shell = imageUser
			sb, vol := r.startCfg(t, cfg)
			if res := run(t, sb, state, 10*time.Second); string(res.Stdout) != want {
				t.Fatalf("before the dump: %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
			}
			if !cfg.UserNS.Enabled && !serverHasCap(t, "CAP_SYS_RESOURCE") {
				testDumpFailsCleanly(t, r, sb, state, want)
				return
			}
			snapName, imgs := r.dump(t, sb, vol)
			rec, err := sandbox.ReadIsolationRecord(imgs)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Shell.CapEff != 0 || rec.Shell.CapPrm != 0 || rec.Shell.CapInh != 0 {
				t.Errorf("dumped shell holds capabilities: %v", rec.Shell)
			}
			child, _, err := r.restoreCfg(t, snapName, imgs, rec, sandbox.Config{Isolation: cfg.Isolation, UserNS: cfg.UserNS})
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if res := run(t, child, state, 10*time.Second); string(res.Stdout) != want {
				t.Errorf("restored shell: %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
			}
			if res := run(t, child, "cd /tmp; export FOO=changed; kill -9 $$", 10*time.Second); !res.ShellRestarted {
				t.Fatalf("kill -9 $$: %+v, want the shell restarted", res)
			}
			if res := run(t, child, state, 10*time.Second); string(res.Stdout) != want {
				t.Errorf("the restored init's new shell: %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
			}
			if st := statusInside(t, child, "/proc/$$/status"); st.CapInh != 0 || st.CapPrm != 0 || st.CapEff != 0 || st.CapAmb != 0 {
				t.Errorf("the restored init's new shell holds capabilities: %v", st)
			}
		})
	}
}

// testDumpFailsCleanly: on a server without CAP_SYS_RESOURCE a dump of a
// sandbox with a non-root shell in host ids fails, saying why, and the
// sandbox runs on with the same shell.
func testDumpFailsCleanly(t *testing.T, r *crRig, sb *sandbox.Sandbox, state, want string) {
	t.Helper()
	t.Log("the server lacks CAP_SYS_RESOURCE: a dump of a non-root task in host ids must fail")
	pid := run(t, sb, "echo $$", 5*time.Second).Stdout
	err := sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		_, err := r.c.Dump(context.Background(), criu.DumpRequest{PID: sb.InitPID(), Dir: t.TempDir(), FreezeCgroup: sb.FreezerCgroup()})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "rlimit") {
		t.Fatalf("dump: %v, want it refused for want of CAP_SYS_RESOURCE (rlimit)", err)
	}
	t.Logf("dump refused: %v", err)
	if res := run(t, sb, "echo $$; "+state, 10*time.Second); string(res.Stdout) != string(pid)+want || res.ShellRestarted {
		t.Errorf("after the failed dump: %q (stderr %q), want the same shell: %q", res.Stdout, res.Stderr, string(pid)+want)
	}
}

// serverHasCap reports whether this process holds capability name.
func serverHasCap(t *testing.T, name string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	st, err := sandbox.ParseTaskIsolation(b)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sandbox.ParseCaps([]string{name})
	if err != nil {
		t.Fatal(err)
	}
	return c.SubsetOf(st.CapEff)
}
