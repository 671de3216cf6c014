package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/ctl"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// fakeRecords is output that imitates status records: the old format, the
// new one with a well-formed nonce and guessable sequence numbers, and a
// lone separator.
const fakeRecords = "1 0 /forged\036" +
	"\036" + "0123456789abcdef0123456789abcdef" + " 2 0 /forged\036" +
	"\036" + "00000000000000000000000000000000" + " 3 0 /forged\036\036\n"

func TestOutputImitatingRecordsIsVerbatim(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	for i := 0; i < 3; i++ {
		r := run(t, sb, fmt.Sprintf("printf '%%s' %s; printf '%%s' %s >&2; cd /tmp; (exit 3)", shq(fakeRecords), shq(fakeRecords)), 10*time.Second)
		if string(r.Stdout) != fakeRecords || string(r.Stderr) != fakeRecords || r.ExitCode != 3 || r.Cwd != "/tmp" {
			t.Fatalf("try %d: stdout=%q stderr=%q exit=%d cwd=%q; want the records verbatim, exit 3, cwd /tmp", i, r.Stdout, r.Stderr, r.ExitCode, r.Cwd)
		}
	}
	// Code that digs the shell's own saved copies of its sockets out of
	// /proc/$$/fd and writes fake records to them, from the shell itself
	// (no nonce init waits for) and from a forked subshell (not the
	// shell's pid): all dropped.
	r := run(t, sb, dupForge+"; echo after", 10*time.Second)
	if string(r.Stdout) != "after\n" || r.ExitCode != 0 || r.RejectedStatus == 0 {
		t.Errorf("fake records on the status socket: stdout=%q stderr=%q exit=%d rejected=%d; want after, 0, >0", r.Stdout, r.Stderr, r.ExitCode, r.RejectedStatus)
	}
}

// dupForge writes fakeRecords to every socket the shell holds, from the
// shell and from a subshell it forks (which keeps close-on-exec copies).
var dupForge = "F=" + shq(fakeRecords) + `; forge() { for f in /proc/$$/fd/*; do case "$(readlink "$f")" in socket:*) eval "printf '%s' \"\$F\" >&${f##*/}" 2>/dev/null;; esac; done; }; forge; (forge; forge); unset -f forge`

func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestForgersCannotForge plants the forgers of sandboxtest/forger in a
// sandbox and runs steps whose output, exit status and directory are
// known: every result must be the step's own. With dockerCaps the forgers
// hold only Docker's default capabilities (what the hardened sandbox
// leaves); without, every capability (a sandbox without that hardening):
// then a forger can reopen init's pipes through /proc/1/fd and add bytes to
// a command's output, but it still cannot forge a status or shift one.
func TestForgersCannotForge(t *testing.T) {
	for _, dockerCaps := range []bool{true, false} {
		t.Run(fmt.Sprintf("docker_caps=%v", dockerCaps), func(t *testing.T) { testForgers(t, dockerCaps) })
	}
}

func testForgers(t *testing.T, dockerCaps bool) {
	sb := start(t, sandbox.Limits{})
	sandboxtest.InstallForger(t, sb.Root())
	flag := ""
	if dockerCaps {
		flag = "-docker-caps "
	}
	modes := []string{"status", "signals", "pty"}
	var starts []string
	for _, m := range modes {
		starts = append(starts, fmt.Sprintf("forger %s%s </dev/null >/tmp/forger-%s.log 2>&1 &", flag, m, m))
	}
	r := run(t, sb, strings.Join(starts, "\n")+"\nforger "+flag+"connect; cat /tmp/forger-connect", 20*time.Second)
	// In user namespace mode init stays dumpable (docs/security.md), and
	// a process as root of the namespace may take its descriptors.
	if !userNS.Enabled && !strings.Contains(string(r.Stdout), "proc1_fd_opened=0 pidfd=true pidfd_getfd=0 reached=[]") {
		t.Errorf("a process inside reached init's control channel: %q (stderr %q)", r.Stdout, r.Stderr)
	}
	t.Logf("connect forger: %s", strings.TrimSpace(string(r.Stdout)))
	// Let every forger get going before the steps.
	waitFile(t, sb, "/tmp/forger-status", "/tmp/forger-signals", "/tmp/forger-pty")

	rejected := 0
	for i := 0; i < 36; i++ {
		dir := fmt.Sprintf("/tmp/s%d", i)
		code := i % 5
		cmd := fmt.Sprintf("mkdir -p %s && cd %s && echo out-%d && echo err-%d >&2", dir, dir, i, i)
		wantOut, wantErr := fmt.Sprintf("out-%d\n", i), fmt.Sprintf("err-%d\n", i)
		switch i % 4 {
		case 0:
			cmd += "; " + dupForge
		case 1:
			cmd += "; sleep 0.2"
		case 2:
			cmd += "; printf '%s' " + shq(fakeRecords)
			wantOut += fakeRecords
		case 3:
			// The shell's children keep default signal dispositions.
			cmd += "; (sh -c 'kill -TERM $$; echo survived'; exit $?) 2>/dev/null; echo $?"
			wantOut += "143\n"
		}
		cmd += fmt.Sprintf("; (exit %d)", code)
		r := run(t, sb, cmd, 20*time.Second)
		rejected += r.RejectedStatus
		okOut := string(r.Stdout) == wantOut && string(r.Stderr) == wantErr
		if !dockerCaps {
			// Forged bytes may join the output; the step's own must be there.
			okOut = inOrder(string(r.Stdout), wantOut) && inOrder(string(r.Stderr), wantErr)
		}
		if !okOut || r.ExitCode != code || r.Cwd != dir || r.TimedOut || r.ShellRestarted {
			t.Errorf("step %d: exit=%d cwd=%q timed_out=%v restarted=%v output ok=%v; want exit=%d cwd=%q stdout=%q stderr=%q; got stdout=%.300q stderr=%.300q",
				i, r.ExitCode, r.Cwd, r.TimedOut, r.ShellRestarted, okOut, code, dir, wantOut, wantErr, r.Stdout, r.Stderr)
		}
	}
	if rejected == 0 {
		t.Errorf("init rejected no status record in 36 steps: the fake records did not reach the status socket")
	}
	if dockerCaps {
		// Shell restarts with the forgers running. (With every capability
		// a forger can reopen the error pipe of init's fork of the new
		// shell through /proc/1/fd and wedge init: see docs/sandbox.md.)
		for i := 0; i < 10; i++ {
			r := run(t, sb, "exit 3", 20*time.Second)
			if !r.ShellRestarted || r.ExitCode != 3 {
				t.Fatalf("exit %d: restarted=%v exit=%d", i, r.ShellRestarted, r.ExitCode)
			}
			if r := run(t, sb, "echo fresh; pwd", 20*time.Second); string(r.Stdout) != "fresh\n/root\n" || r.ExitCode != 0 {
				t.Fatalf("after restart %d: stdout=%.300q exit=%d", i, r.Stdout, r.ExitCode)
			}
		}
	}
	st := readFile(t, sb, "/tmp/forger-status")
	t.Logf("status forger: %s; rejected while steps ran: %d", st, rejected)
	t.Logf("signal forger: %s", readFile(t, sb, "/tmp/forger-signals"))
	if !strings.Contains(readFile(t, sb, "/tmp/forger-signals"), "sent=") {
		t.Errorf("the signal forger sent nothing")
	}
	// A round of the pty forger that started after the last shell start:
	// every terminal it still holds a working descriptor of.
	pty := nextRound(t, sb, "/tmp/forger-pty")
	opened, _ := os.ReadFile(filepath.Join(sb.Root(), "tmp", "forger-pty-opened"))
	t.Logf("pty forger: %s; opened: %.300q", pty, opened)
	if !strings.Contains(st, "own_socket_writes=0") {
		t.Errorf("a process a command started holds the shell's sockets: %s", st)
	}
	if dockerCaps {
		if !strings.Contains(st, "proc1_opened=0 ") {
			t.Errorf("without CAP_SYS_PTRACE a forger opened init's descriptors: %s", st)
		}
		// A forger may open a new pty in the moment before init makes it
		// exclusive; init then throws that pty away (the forger's
		// descriptor is hung up) and the shell gets another one.
		if !strings.Contains(pty, " live=[]") {
			t.Errorf("without CAP_SYS_ADMIN a forger holds a working descriptor of a terminal: %s (opened: %.300s)", pty, opened)
		}
	}
	// Every forger is still running: they were not simply killed.
	for _, m := range modes {
		// Not ps: procps lists only the caller's terminal without -e.
		r = run(t, sb, fmt.Sprintf(`for p in /proc/[0-9]*; do tr '\0' ' ' <$p/cmdline; echo; done 2>/dev/null | grep -q '^forger.* %s $'`, m), 10*time.Second)
		if r.ExitCode != 0 {
			t.Errorf("the %s forger died", m)
		}
	}
}

// TestShellPtyTakenInWindow: a process that opens a new shell's terminal in
// the moment between init's unlock of the pty and TIOCEXCL does not end up
// holding the terminal the shell uses. Init's test pause
// (ARBOR_TEST_PTY_HOLD, sandbox/initd/pty_linux.go) holds that moment open
// until the window forger has opened the slave; init must then throw that
// pty away and start the shell on another one.
func TestShellPtyTakenInWindow(t *testing.T) {
	t.Setenv("ARBOR_TEST_PTY_HOLD", "/tmp/pty-hold")
	sb := start(t, sandbox.Limits{})
	sandboxtest.InstallForger(t, sb.Root())
	run(t, sb, "mkdir /tmp/pty-hold && touch /tmp/pty-hold/hold && { forger -docker-caps window </dev/null >/tmp/forger-window.log 2>&1 & }", 10*time.Second)
	// The restart makes a new pty: init pauses after its unlock.
	if r := run(t, sb, "exit 3", 60*time.Second); !r.ShellRestarted || r.ExitCode != 3 {
		t.Fatalf("exit 3: restarted=%v exit=%d", r.ShellRestarted, r.ExitCode)
	}
	if _, err := os.Stat(filepath.Join(sb.Root(), "tmp/pty-hold/hold")); err == nil {
		t.Fatalf("init did not take the test pause (%s not passed on?)", "ARBOR_TEST_PTY_HOLD")
	}
	w := nextRound(t, sb, "/tmp/forger-window")
	if !strings.Contains(w, " open=ok ") {
		t.Fatalf("the window forger did not open the pty in the pause: %s", w)
	}
	var taken string
	fmt.Sscanf(w[strings.Index(w, " pts=")+1:], "pts=%s", &taken)
	// The terminal the shell uses: its saved 0 and 2 (a command runs with
	// its own 0-2).
	r := run(t, sb, `for f in /proc/$$/fd/*; do readlink "$f"; done | grep '^/dev/pts/' | sort -u`, 10*time.Second)
	term := strings.TrimSpace(string(r.Stdout))
	if !strings.HasPrefix(term, "/dev/pts/") || strings.Contains(term, "\n") {
		t.Fatalf("the shell's terminal: %q (stderr %q)", term, r.Stderr)
	}
	t.Logf("window forger: %s; shell's terminal %s", w, term)
	if term == "/dev/pts/"+taken || strings.Contains(w, "live=true") {
		t.Errorf("the forger that opened /dev/pts/%s in the window holds the shell's terminal %s: %s", taken, term, w)
	}
	if r := run(t, sb, "echo fresh", 10*time.Second); string(r.Stdout) != "fresh\n" || r.ShellRestarted {
		t.Errorf("after the restart: stdout=%q restarted=%v", r.Stdout, r.ShellRestarted)
	}
}

// inOrder reports whether every line of want appears in got, in order
// (other bytes may come between them).
func inOrder(got, want string) bool {
	for _, l := range strings.SplitAfter(want, "\n") {
		i := strings.Index(got, l)
		if i < 0 {
			return false
		}
		got = got[i+len(l):]
	}
	return true
}

// nextRound waits until the forger report at p (inside the sandbox, a line
// starting "rounds=N ") shows a round that started after this call, and
// returns it.
func nextRound(t *testing.T, sb *sandbox.Sandbox, p string) string {
	t.Helper()
	rounds := func(s string) int {
		var n int
		fmt.Sscanf(s, "rounds=%d", &n)
		return n
	}
	first := rounds(readFile(t, sb, p))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s := readFile(t, sb, p); rounds(s) >= first+2 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no new round after %d", p, first)
		}
	}
}

// waitFile waits until each of paths (inside the sandbox) exists.
func waitFile(t *testing.T, sb *sandbox.Sandbox, paths ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, p := range paths {
		for {
			if _, err := os.Stat(filepath.Join(sb.Root(), p)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not appear", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func readFile(t *testing.T, sb *sandbox.Sandbox, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sb.Root(), p))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestControlChannelOutOfReach: whatever a process inside does to the
// sandbox's file tree (removes /.arbor, binds a socket of its own where an
// older init listened, which answers every request with a forged result), the server still reaches init: commands and Run
// after a reconnect, a CRIU dump, and both the restored child and the
// parent afterwards give real results. No process inside can take init's
// descriptors (/proc/1/fd, pidfd_getfd), and none holds an end of the
// channel.
func TestControlChannelOutOfReach(t *testing.T) {
	r := newCRRig(t)
	for _, tt := range []struct {
		name, cmd string
	}{
		{name: "rm -rf /.arbor", cmd: "rm -rf /.arbor"},
		{name: "an impostor at the old socket path", cmd: "forger rebind </dev/null >/dev/null 2>&1 & while [ ! -e /tmp/forger-rebind ]; do sleep 0.01; done; cat /tmp/forger-rebind"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sb, vol := r.start(t, sandbox.Isolation{})
			sandboxtest.InstallForger(t, sb.Root())
			run(t, sb, "cd /tmp; export MARK=kept", 10*time.Second)
			res := run(t, sb, tt.cmd, 10*time.Second)
			if strings.Contains(tt.name, "impostor") && string(res.Stdout) != "listening\n" {
				t.Fatalf("the impostor did not bind: %q %q", res.Stdout, res.Stderr)
			}
			// Every connection from here on is a new one.
			checkChannel(t, sb, "after "+tt.cmd)
			snapName, imgs := r.dump(t, sb, vol)
			rec, err := sandbox.ReadIsolationRecord(imgs)
			if err != nil {
				t.Fatal(err)
			}
			child, _, err := r.restore(t, snapName, imgs, rec, sandbox.Isolation{})
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			checkChannel(t, child, "restored child")
			checkChannel(t, sb, "parent after the dump")
			if _, err := os.Stat(filepath.Join(sb.Root(), "tmp", "pwned")); err == nil {
				t.Errorf("the impostor was asked to run a command")
			}
		})
	}
}

// checkChannel reconnects to sb and checks that a command (in the shell,
// with its state) and Run (outside it) give real results, that a process
// inside can reach none of init's descriptors, and that no process but
// init holds an end of the control channel.
func checkChannel(t *testing.T, sb *sandbox.Sandbox, when string) {
	t.Helper()
	ctx := context.Background()
	sb.Disconnect()
	r, err := sb.Exec(ctx, "echo real $MARK", sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || string(r.Stdout) != "real kept\n" || r.Cwd != "/tmp" || r.ExitCode != 0 {
		t.Fatalf("%s: exec: %+v, %v; want \"real kept\" in /tmp", when, r, err)
	}
	sb.Disconnect()
	r, err = sb.Run(ctx, "echo verifier ${MARK-unset}", sandbox.RunOptions{})
	if err != nil || string(r.Stdout) != "verifier unset\n" || r.ExitCode != 0 {
		t.Fatalf("%s: run: %+v, %v", when, r, err)
	}
	r = run(t, sb, "forger -docker-caps connect; cat /tmp/forger-connect", 20*time.Second)
	if got := string(r.Stdout); !strings.Contains(got, "proc1_fd_opened=0 pidfd=true pidfd_getfd=0 reached=[]") {
		t.Errorf("%s: a process inside reached init's descriptors: %q (stderr %q)", when, got, r.Stderr)
	}
	if holders := channelHolders(t, sb); len(holders) > 0 {
		t.Errorf("%s: processes other than init hold an end of the control channel: %v", when, holders)
	}
}

// channelHolders lists the host pids, other than init, of the processes in
// sb's pid namespace that hold a descriptor of either end of init's
// control channel (ctl.ChannelFD, ctl.ServerEndFD).
func channelHolders(t *testing.T, sb *sandbox.Sandbox) []int {
	t.Helper()
	init := sb.InitPID()
	ends := map[string]bool{}
	for _, fd := range []int{ctl.ChannelFD, ctl.ServerEndFD} {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", init, fd))
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			t.Fatalf("init's descriptor %d: %q, %v; want a socket", fd, l, err)
		}
		ends[l] = true
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
	if err != nil {
		t.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var holders []int
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if pid == init {
			continue
		}
		if l, err := os.Readlink(p + "/ns/pid"); err != nil || l != ns {
			continue
		}
		fds, _ := os.ReadDir(p + "/fd")
		for _, fd := range fds {
			if l, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && ends[l] {
				holders = append(holders, pid)
			}
		}
	}
	return holders
}

func TestRunOutsideTheShell(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	// The agent's shell state, which a verifier must not see.
	run(t, sb, "export LEAK=shell; test() { return 0; }; alias cat='echo aliased'; cd /tmp; sleep 300 >/dev/null 2>&1 &", 10*time.Second)
	ctx := context.Background()
	tests := []struct {
		name, script string
		o            sandbox.RunOptions
		stdout       string
		stderr       string // checked when not empty
		exit         int
		cwd          string
		timedOut     bool
	}{
		{name: "no functions, aliases or exports of the shell", script: `test 1 = 2; echo "test=$? leak=${LEAK-unset}"; type cat | grep -c alias`,
			stdout: "test=1 leak=unset\n0\n", exit: 1, cwd: "/"},
		{name: "environment is the request's plus PATH and HOME", script: `env | grep -v -e '^SHLVL=' -e '^PWD=' -e '^_=' | sort`, o: sandbox.RunOptions{Env: []string{"A=1", "B=two words"}},
			stdout: "A=1\nB=two words\nHOME=/root\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n", cwd: "/"},
		{name: "directory", script: `pwd`, o: sandbox.RunOptions{Dir: "/tmp"}, stdout: "/tmp\n", cwd: "/tmp"},
		{name: "missing directory runs in / with a note", script: `pwd`, o: sandbox.RunOptions{Dir: "/nonexistent"}, stdout: "/\n",
			stderr: "arbor: directory /nonexistent is missing; running in /\n", cwd: "/"},
		{name: "stdin is empty, streams separate", script: `cat; echo out; echo err >&2; exit 4`, stdout: "out\n", stderr: "err\n", exit: 4, cwd: "/"},
		{name: "own session, no terminal", script: `test "$(cut -d' ' -f6 /proc/$$/stat)" = "$$" && echo leader; tty || true`,
			stdout: "leader\nnot a tty\n", cwd: "/"},
		{name: "timeout kills its process group", script: `sleep 100 & sleep 100`, o: sandbox.RunOptions{Timeout: 300 * time.Millisecond},
			exit: 124, cwd: "/", timedOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := sb.Run(ctx, tt.script, tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if string(r.Stdout) != tt.stdout || r.ExitCode != tt.exit || r.Cwd != tt.cwd || r.TimedOut != tt.timedOut ||
				(tt.stderr != "" && string(r.Stderr) != tt.stderr) || r.ShellRestarted {
				t.Errorf("got stdout=%q stderr=%q exit=%d cwd=%q timed_out=%v; want stdout=%q stderr=%q exit=%d cwd=%q timed_out=%v",
					r.Stdout, r.Stderr, r.ExitCode, r.Cwd, r.TimedOut, tt.stdout, tt.stderr, tt.exit, tt.cwd, tt.timedOut)
			}
		})
	}
	r, err := sb.Run(ctx, "head -c 100000 /dev/zero | tr '\\0' a", sandbox.RunOptions{MaxOutput: 1000})
	if err != nil || !r.Truncated || r.StdoutBytes != 100000 || len(r.Stdout) > 1100 {
		t.Errorf("output cap: err %v truncated=%v bytes=%d kept=%d", err, r.Truncated, r.StdoutBytes, len(r.Stdout))
	}
	// The timed-out script's background sleep went with its group, and the
	// agent's shell and its job are untouched.
	r = run(t, sb, "ps -o args= | grep -c '^sleep 100$'; jobs | grep -c 'sleep 300'; pwd; echo $LEAK", 10*time.Second)
	if string(r.Stdout) != "0\n1\n/tmp\nshell\n" {
		t.Errorf("after Run: %q (want no sleep 100, the shell's job, /tmp, shell)", r.Stdout)
	}
}

func TestKillAllButInit(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	run(t, sb, "export KEEP=1; for i in 1 2 3; do sleep 300 >/dev/null 2>&1 & done; (setsid sleep 301 >/dev/null 2>&1 &)", 10*time.Second)
	// What a timeout error would say: each task with its state (the
	// last sleep may still be a forked shell for a moment).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		d := sandbox.DescribeTasks(sb)
		if strings.HasPrefix(d, "tasks: ") && strings.Count(d, " sleep S ") == 4 {
			t.Log(d)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DescribeTasks = %q, want the four sleeping sleeps", d)
		}
	}
	n, err := sb.KillAllButInit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Three sleeps, the orphan and the shell.
	if n < 5 {
		t.Errorf("killed %d processes, want at least 5", n)
	}
	r := run(t, sb, "ps -o args= | grep -c '^sleep 30'; echo ${KEEP-fresh}", 10*time.Second)
	if !r.ShellRestarted || string(r.Stdout) != "0\nfresh\n" {
		t.Errorf("after KillAllButInit: restarted=%v stdout=%q, want a fresh shell and no sleep", r.ShellRestarted, r.Stdout)
	}
}

// TestShellThatCannotStart: when init cannot start a new shell (the agent
// moved it away), KillAllButInit says why instead of waiting for one, a
// command fails with the reason, and a shell comes back once its binary
// is there again.
func TestShellThatCannotStart(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	shell := strings.TrimSpace(string(run(t, sb, "readlink /proc/$$/exe", 10*time.Second).Stdout))
	if shell == "" {
		t.Fatal("no shell path")
	}
	// busybox's sh is a link to busybox: move the name init starts.
	name := "/bin/sh"
	if strings.HasSuffix(shell, "bash") {
		name = shell
	}
	run(t, sb, "mv "+name+" "+name+".gone", 10*time.Second)
	_, err := sb.KillAllButInit(context.Background())
	if err == nil || !strings.Contains(err.Error(), "init could not start one") || !strings.Contains(err.Error(), name) {
		t.Fatalf("KillAllButInit with no shell binary: %v, want init's reason naming %s", err, name)
	}
	if r, err := sb.Exec(context.Background(), "echo hi", sandbox.ExecOptions{Timeout: 10 * time.Second}); err == nil || !strings.Contains(err.Error(), "no shell") || !strings.Contains(err.Error(), name) {
		t.Fatalf("a command with no shell binary: %v %+v, want an error naming %s", err, r, name)
	}
	if err := os.Rename(filepath.Join(sb.Root(), name+".gone"), filepath.Join(sb.Root(), name)); err != nil {
		t.Fatal(err)
	}
	r := run(t, sb, "echo back", 10*time.Second)
	if string(r.Stdout) != "back\n" || r.ExitCode != 0 || !r.ShellRestarted {
		t.Errorf("after the shell came back: %+v", r)
	}
}

// TestLargeCommand: a command far larger than the command socket's
// buffer reaches the shell whole, and the next one is not disturbed.
func TestLargeCommand(t *testing.T) {
	sb := start(t, sandbox.Limits{})
	body := strings.Repeat("0123456789abcdef\n", 40000) // 680 KB
	r := run(t, sb, "cat <<'EOF' | wc -c\n"+body+"EOF", 60*time.Second)
	if strings.TrimSpace(string(r.Stdout)) != fmt.Sprint(len(body)) || r.ExitCode != 0 {
		t.Fatalf("large command: stdout=%q stderr=%.300q exit=%d; want %d", r.Stdout, r.Stderr, r.ExitCode, len(body))
	}
	if r := run(t, sb, "echo next", 10*time.Second); string(r.Stdout) != "next\n" {
		t.Errorf("after a large command: %q", r.Stdout)
	}
	// Without head on PATH the shell reads the text itself; trailing
	// newlines survive either way.
	text := strings.Repeat("a", 5000)
	for _, path := range []string{"/nonexistent", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"} {
		r := run(t, sb, "PATH="+path+"; v='"+text+"\n\n'; echo ${#v}\n\n", 20*time.Second)
		if string(r.Stdout) != "5002\n" || r.ExitCode != 0 {
			t.Errorf("PATH=%s: stdout=%q stderr=%.300q exit=%d; want 5002", path, r.Stdout, r.Stderr, r.ExitCode)
		}
	}
}
