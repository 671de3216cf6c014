package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// imageUser is the config of an image with a non-root USER, an
// environment of its own and a WORKDIR that does not exist yet below
// /work (which does, root's).
var imageUser = sandbox.ShellConfig{
	Env:    []string{"FOO=bar baz", "PATH=/opt/tool/bin:/usr/bin:/bin", "EMPTY="},
	Dir:    "/work/app/src",
	UID:    1000,
	GID:    1000,
	Groups: []uint32{1000, 27},
}

// forUser readies a test root for a non-root user: / of mode 0755 (a
// debian rootfs cached by an older image/debian.go has MkdirTemp's 0700,
// which no other user can enter) and /work (root's, 0755), as the busybox
// root has both.
func forUser(root string) {
	os.Chmod(root, 0o755)
	os.MkdirAll(filepath.Join(root, "work"), 0o755)
	os.Chmod(filepath.Join(root, "work"), 0o755)
}

// userState is what every shell of an imageUser sandbox must show: its
// ids, groups, environment and directory, as one line each.
const userStateCmd = `id -u; id -g; id -G | tr ' ' '\n' | sort -un | tr '\n' ' '; echo; echo "$FOO|$PATH|$TERM|$LANG|$HOME|${EMPTY-unset}"; pwd`

const userState = "1000\n1000\n27 1000 \nbar baz|/opt/tool/bin:/usr/bin:/bin|dumb|C.UTF-8|/root|\n/work/app/src\n"

// TestShellConfig: a sandbox started with an image's non-root user,
// environment and directory runs every command of a step as that user,
// with that environment, starting in that directory, which Start created
// for the user; the user holds no capability and cannot write what root
// owns; init replaces a dead shell with one just like it; the verifier
// (Run) still runs as root with its own environment.
func TestShellConfig(t *testing.T) {
	sb, err := startCfg(t, sandbox.Config{Shell: imageUser}, forUser)
	if err != nil {
		t.Fatalf("start sandbox: %v", err)
	}
	// The first command: before it nothing ran in the shell.
	t.Run("first command starts in Dir, made for the user", func(t *testing.T) {
		r := run(t, sb, "pwd; stat -c '%u:%g %a' /work /work/app /work/app/src", 10*time.Second)
		want := "/work/app/src\n0:0 755\n1000:1000 755\n1000:1000 755\n"
		if string(r.Stdout) != want || r.Cwd != imageUser.Dir || r.ShellRestarted {
			t.Errorf("got %q (stderr %q) cwd %q restarted %v, want %q in %s", r.Stdout, r.Stderr, r.Cwd, r.ShellRestarted, want, imageUser.Dir)
		}
	})
	t.Run("ids, groups, environment", func(t *testing.T) {
		r := run(t, sb, userStateCmd+"; grep -E '^(Uid|Gid|Groups):' /proc/$$/status | tr -s '\\t ' ' '", 10*time.Second)
		want := userState + "Uid: 1000 1000 1000 1000\nGid: 1000 1000 1000 1000\nGroups: 27 1000 \n"
		if string(r.Stdout) != want {
			t.Errorf("got %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
		}
		r = run(t, sb, `echo "$SHELL"; sh -c 'echo "child: $FOO"'`, 10*time.Second)
		if lines := strings.Split(string(r.Stdout), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "/") || !strings.HasSuffix(lines[0], "sh") || lines[1] != "child: bar baz" {
			t.Errorf("got %q, want the default SHELL and FOO exported", r.Stdout)
		}
	})
	t.Run("no capabilities", func(t *testing.T) {
		for _, p := range []string{"/proc/$$/status", "/proc/self/status"} {
			st := statusInside(t, sb, p)
			if st.CapInh != 0 || st.CapPrm != 0 || st.CapEff != 0 || st.CapAmb != 0 || st.CapBnd != dockerCaps || st.NoNewPrivs != 1 || st.Seccomp != 2 {
				t.Errorf("%s: %v, want no capability but the bounding set (%s), no_new_privs and the filter", p, st, dockerCaps)
			}
		}
		rec, err := sb.Isolation()
		if err != nil || rec.ShellPID == 0 || rec.Shell.CapEff != 0 {
			t.Errorf("isolation record %+v: %v", rec, err)
		}
	})
	t.Run("root's files are out of reach", func(t *testing.T) {
		passwd, err := os.ReadFile(filepath.Join(sb.Root(), "etc", "passwd"))
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct{ name, cmd, want string }{
			{"append to /etc/passwd", "echo 'x::0:0::/:/bin/sh' >> /etc/passwd", "Permission denied"},
			{"create a file in /etc", "touch /etc/arbor-agent", "Permission denied"},
			{"chown a file of root's", "chown 1000 /etc/passwd", "Operation not permitted"},
			{"chroot", "PATH=$PATH:/usr/sbin chroot / true", "Operation not permitted"},
			{"signal init", "kill -9 1", "Operation not permitted"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := run(t, sb, tt.cmd, 10*time.Second)
				if r.ExitCode == 0 || !strings.Contains(string(r.Stderr), tt.want) {
					t.Errorf("%q: exit %d, stderr %q; want it refused (%s)", tt.cmd, r.ExitCode, r.Stderr, tt.want)
				}
			})
		}
		if after, _ := os.ReadFile(filepath.Join(sb.Root(), "etc", "passwd")); string(after) != string(passwd) {
			t.Errorf("/etc/passwd changed: %q", after)
		}
		if _, err := os.Stat(filepath.Join(sb.Root(), "etc", "arbor-agent")); err == nil {
			t.Error("the user created /etc/arbor-agent")
		}
	})
	t.Run("a background job keeps the uid", func(t *testing.T) {
		r := run(t, sb, "sleep 300 >/dev/null 2>&1 & echo $!", 10*time.Second)
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.Stdout)))
		if err != nil {
			t.Fatalf("no pid: %q", r.Stdout)
		}
		r = run(t, sb, fmt.Sprintf("awk '/^Uid:/ {print $2}' /proc/%d/status; cat /proc/%d/oom_score_adj", pid, pid), 10*time.Second)
		if string(r.Stdout) != "1000\n500\n" {
			t.Errorf("background job: %q, want uid 1000 and the agent's OOM score 500", r.Stdout)
		}
		host, err := sb.HostPID(pid)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", host))
		if err != nil {
			t.Fatal(err)
		}
		want := uint32(1000)
		if u := sb.UserNS(); u.Enabled {
			want += u.HostID
		}
		if !strings.Contains(string(st), fmt.Sprintf("\nUid:\t%d\t", want)) {
			t.Errorf("on the host the job is not uid %d: %s", want, st)
		}
	})
	t.Run("the verifier runs as root", func(t *testing.T) {
		r, err := sb.Run(context.Background(), "id -u; pwd; echo ${FOO-unset}", sandbox.RunOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Stdout) != "0\n/\nunset\n" {
			t.Errorf("Run: %q (stderr %q), want root in / without the image's environment", r.Stdout, r.Stderr)
		}
	})
	restarts := []struct {
		name string
		kill func(t *testing.T)
	}{
		{"kill -9 $$", func(t *testing.T) {
			if r := run(t, sb, "cd /tmp; export FOO=changed; kill -9 $$", 10*time.Second); !r.ShellRestarted {
				t.Fatalf("kill -9 $$: %+v, want the shell restarted", r)
			}
		}},
		{"exit", func(t *testing.T) {
			if r := run(t, sb, "cd /tmp; exit 3", 10*time.Second); !r.ShellRestarted || r.ExitCode != 3 {
				t.Fatalf("exit 3: %+v, want the shell restarted", r)
			}
		}},
		{"KillAllButInit", func(t *testing.T) {
			run(t, sb, "cd /tmp", 10*time.Second)
			if _, err := sb.KillAllButInit(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range restarts {
		t.Run("restart after "+tt.name, func(t *testing.T) {
			tt.kill(t)
			r := run(t, sb, userStateCmd+"; cat /proc/$$/oom_score_adj", 10*time.Second)
			if want := userState + "500\n"; string(r.Stdout) != want || r.Cwd != imageUser.Dir {
				t.Errorf("new shell: %q (stderr %q) cwd %q, want %q", r.Stdout, r.Stderr, r.Cwd, want)
			}
			if st := statusInside(t, sb, "/proc/$$/status"); st.CapInh != 0 || st.CapPrm != 0 || st.CapEff != 0 || st.CapAmb != 0 {
				t.Errorf("new shell holds capabilities: %v", st)
			}
		})
	}
	// Last: it takes the shell's directory away.
	t.Run("a Dir gone by a restart is not made again", func(t *testing.T) {
		if r := run(t, sb, "cd / && rmdir /work/app/src && exit 0", 10*time.Second); !r.ShellRestarted {
			t.Fatalf("rmdir and exit: %+v", r)
		}
		r := run(t, sb, "pwd; id -u; test -e /work/app/src && echo made || echo gone", 10*time.Second)
		if string(r.Stdout) != "/\n1000\ngone\n" || r.Cwd != "/" {
			t.Errorf("got %q (stderr %q) cwd %q, want the new shell in / and no /work/app/src", r.Stdout, r.Stderr, r.Cwd)
		}
	})
}

// TestShellConfigZeroIsRoot: the zero ShellConfig is the shell there
// always was, root in /root with the default environment, holding the
// sandbox's capabilities.
func TestShellConfigZeroIsRoot(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	r := run(t, sb, `id -u; id -G; pwd; echo "$PATH|$HOME|$TERM|$LANG"`, 10*time.Second)
	want := "0\n0\n/root\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|/root|dumb|C.UTF-8\n"
	if string(r.Stdout) != want {
		t.Errorf("got %q, want %q", r.Stdout, want)
	}
	if st := statusInside(t, sb, "/proc/$$/status"); st.CapEff != dockerCaps || st.CapInh != dockerCaps {
		t.Errorf("root shell: %v, want Docker's capabilities", st)
	}
}

// TestShellConfigFewerCaps: a non-root shell in a sandbox that keeps only
// CAP_SETUID and CAP_SETGID, so that init cannot chown its terminal and
// can write the shell's /proc files only while its exec is under way:
// the shell still starts, as its user, with the agent's OOM score (which
// its set-up line sets too, rather than keep init's -1000 should init's
// write come too late).
func TestShellConfigFewerCaps(t *testing.T) {
	sb, err := startCfg(t, sandbox.Config{Isolation: sandbox.Isolation{Caps: []string{"CAP_SETUID", "CAP_SETGID"}},
		Shell: sandbox.ShellConfig{UID: 1000, GID: 1000, Dir: "/tmp"}}, forUser)
	if err != nil {
		t.Fatalf("start sandbox: %v", err)
	}
	r := run(t, sb, "id -u; pwd; cat /proc/$$/oom_score_adj", 10*time.Second)
	if string(r.Stdout) != "1000\n/tmp\n500\n" {
		t.Errorf("got %q (stderr %q), want uid 1000 in /tmp with OOM score 500", r.Stdout, r.Stderr)
	}
}

// TestShellConfigRefused: a config Start refuses before it makes anything
// (ErrBadConfig, naming the field), and ones that init cannot start a
// shell with, which fail Start with the reason and leave nothing behind.
func TestShellConfigRefused(t *testing.T) {
	sandboxtest.RequireRoot(t)
	tests := []struct {
		name    string
		cfg     sandbox.Config
		prepare func(root string)
		bad     bool   // ErrBadConfig, nothing made at all
		want    string // in the error
	}{
		{name: "relative Dir", cfg: sandbox.Config{Shell: sandbox.ShellConfig{Dir: "work"}}, bad: true, want: `Shell.Dir "work": not an absolute path`},
		{name: "unclean Dir", cfg: sandbox.Config{Shell: sandbox.ShellConfig{Dir: "/work/../etc"}}, bad: true, want: "Shell.Dir"},
		{name: "empty key", cfg: sandbox.Config{Shell: sandbox.ShellConfig{Env: []string{"A=1", "=x"}}}, bad: true, want: `Shell.Env[1] "=x": empty key`},
		{name: "no =", cfg: sandbox.Config{Shell: sandbox.ShellConfig{Env: []string{"FOO"}}}, bad: true, want: "Shell.Env[0]"},
		{name: "NUL in a value", cfg: sandbox.Config{Shell: sandbox.ShellConfig{Env: []string{"A=x\x00y"}}}, bad: true, want: "Shell.Env[0]"},
		{name: "uid -1", cfg: sandbox.Config{Shell: sandbox.ShellConfig{UID: ^uint32(0)}}, bad: true, want: "Shell.UID"},
		{name: "no CAP_SETUID", cfg: sandbox.Config{Shell: sandbox.ShellConfig{UID: 1000}, Isolation: sandbox.Isolation{Caps: []string{"CAP_CHOWN"}}}, bad: true, want: "CAP_SETUID"},
		{name: "id outside the user namespace", cfg: sandbox.Config{Shell: sandbox.ShellConfig{UID: 70000}, UserNS: sandbox.UserNSConfig{Enabled: true}}, bad: true, want: "id 70000"},
		{name: "Dir is a file", cfg: sandbox.Config{Shell: sandbox.ShellConfig{Dir: "/etc/passwd"}}, want: "not a directory"},
		{name: "Dir the user cannot enter", cfg: sandbox.Config{Shell: sandbox.ShellConfig{UID: 1000, GID: 1000, Dir: "/root/work"}},
			prepare: func(root string) { os.Chmod(filepath.Join(root, "root"), 0o700) }, want: "permission denied"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := sandboxtest.BusyboxRoot(t, "")
			if tt.prepare != nil {
				tt.prepare(root)
			}
			cfg := tt.cfg
			cfg.ID = fmt.Sprintf("badshell-%d-%d", os.Getpid(), i)
			cfg.Root, cfg.InitBinary = root, sandboxtest.InitBinary(t)
			sb, err := sandbox.Start(context.Background(), cfg)
			if err == nil {
				sb.Destroy(context.Background())
				t.Fatalf("started with %+v", cfg.Shell)
			}
			if errors.Is(err, sandbox.ErrBadConfig) != tt.bad || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an error with %q (ErrBadConfig: %v)", err, tt.want, tt.bad)
			}
			t.Logf("refused: %v", err)
			for _, d := range []string{"unified", "memory", "pids", "cpu"} {
				if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", d, "arbor", cfg.ID)); err == nil {
					t.Errorf("cgroup %s/arbor/%s left behind", d, cfg.ID)
				}
			}
			procs, _ := filepath.Glob("/proc/[0-9]*/root")
			for _, p := range procs {
				if l, err := os.Readlink(p); err == nil && strings.HasPrefix(l, root) {
					t.Errorf("process %s still lives in the sandbox root", p)
				}
			}
			if _, err := os.Stat(filepath.Join(root, ".arbor")); tt.bad && err == nil {
				t.Error("a refused config got init installed in the root")
			}
		})
	}
}

// TestShellConfigValidate: the rules of ShellConfig.Validate, field by
// field.
func TestShellConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   sandbox.ShellConfig
		field string // "" when valid
	}{
		{"zero", sandbox.ShellConfig{}, ""},
		{"full", imageUser, ""},
		{"root dir", sandbox.ShellConfig{Dir: "/"}, ""},
		{"empty value", sandbox.ShellConfig{Env: []string{"A="}}, ""},
		{"= in the value", sandbox.ShellConfig{Env: []string{"A=b=c"}}, ""},
		{"relative", sandbox.ShellConfig{Dir: "app"}, "Dir"},
		{"dot", sandbox.ShellConfig{Dir: "/app/."}, "Dir"},
		{"trailing slash", sandbox.ShellConfig{Dir: "/app/"}, "Dir"},
		{"double slash", sandbox.ShellConfig{Dir: "//app"}, "Dir"},
		{"NUL in Dir", sandbox.ShellConfig{Dir: "/a\x00b"}, "Dir"},
		{"no =", sandbox.ShellConfig{Env: []string{"A"}}, "Env[0]"},
		{"empty key", sandbox.ShellConfig{Env: []string{"A=1", "=1"}}, "Env[1]"},
		{"empty entry", sandbox.ShellConfig{Env: []string{""}}, "Env[0]"},
		{"NUL in a key", sandbox.ShellConfig{Env: []string{"A\x00=1"}}, "Env[0]"},
		{"gid -1", sandbox.ShellConfig{GID: ^uint32(0)}, "GID"},
		{"group -1", sandbox.ShellConfig{Groups: []uint32{5, ^uint32(0)}}, "Groups[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrBadConfig) || !strings.Contains(err.Error(), "Shell."+tt.field) {
				t.Fatalf("got %v, want ErrBadConfig naming Shell.%s", err, tt.field)
			}
		})
	}
}

// TestShellConfigWire: every field of ShellConfig reaches init.
func TestShellConfigWire(t *testing.T) {
	got, err := sandbox.ShellWireJSON(imageUser)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Env, imageUser.Env) || got.Dir != imageUser.Dir || got.UID != imageUser.UID || got.GID != imageUser.GID || !slices.Equal(got.Groups, imageUser.Groups) {
		t.Errorf("init gets %+v, want %+v", got, imageUser)
	}
}
