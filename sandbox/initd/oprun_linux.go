package initd

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// runShell interprets OpRun scripts. It is /bin/sh whatever shell the
// sandbox's persistent shell is: verifiers are written for POSIX sh.
const runShell = "/bin/sh"

// runEnv is the environment of an OpRun child: exactly the request's,
// plus PATH and HOME when it lacks them. Nothing of init's or the
// persistent shell's environment leaks in.
func runEnv(req []string) []string {
	env := make([]string, 0, len(req)+2)
	var path, home bool
	for _, kv := range req {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			continue
		}
		path = path || k == "PATH"
		home = home || k == "HOME"
		env = append(env, kv)
	}
	if !path {
		env = append(env, "PATH="+defaultPath)
	}
	if !home {
		env = append(env, "HOME=/root")
	}
	return env
}

// runScript runs req.Cmd as `/bin/sh -c` in a fresh child of init (see
// ctl.OpRun). Its stdout and stderr are pipes made right before the fork;
// init closes its copies of the write ends right after it, so the child
// and its descendants are their only writers (save a process that
// reopens them through /proc/PID/fd, which the caller rules out by
// stopping everything else first). The exit status comes from waitpid.
// Its output goes to o.
func (s *shell) runScript(req ctl.Request, o *output) ctl.Response {
	if len(req.Cmd) > ctl.MaxCommand {
		return ctl.Response{Error: fmt.Sprintf("script is %d bytes, over the %d byte limit", len(req.Cmd), ctl.MaxCommand)}
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = ctl.DefaultTimeout
	}
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		// The sandbox's own state (the agent removed the directory) is
		// the script's problem, not an infrastructure failure.
		o.put(ctl.StreamStderr, fmt.Appendf(nil, "arbor: directory %s is missing; running in /\n", dir))
		dir = "/"
	}
	var p [4]int
	if err := unix.Pipe2(p[0:2], unix.O_CLOEXEC); err != nil {
		return ctl.Response{Error: fmt.Sprintf("pipe: %v", err)}
	}
	if err := unix.Pipe2(p[2:4], unix.O_CLOEXEC); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return ctl.Response{Error: fmt.Sprintf("pipe: %v", err)}
	}
	outR, outW, errR, errW := p[0], p[1], p[2], p[3]
	unix.SetNonblock(outR, true)
	unix.SetNonblock(errR, true)
	defer unix.Close(outR)
	defer unix.Close(errR)
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(outW)
		unix.Close(errW)
		return ctl.Response{Error: fmt.Sprintf("open /dev/null: %v", err)}
	}
	start := time.Now()
	pid, err := syscall.ForkExec(runShell, []string{"sh", "-c", req.Cmd}, &syscall.ProcAttr{
		Dir:   dir,
		Env:   runEnv(req.Env),
		Files: []uintptr{uintptr(null), uintptr(outW), uintptr(errW)},
		// Its own session and process group: no terminal, and one kill
		// reaches everything it started that stayed in its group.
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	unix.Close(null)
	unix.Close(outW)
	unix.Close(errW)
	if err != nil {
		// A missing or broken /bin/sh is the sandbox's state: report it
		// as a shell would, so the verifier fails instead of erroring.
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) {
			o.put(ctl.StreamStderr, fmt.Appendf(nil, "arbor: start %s: %v\n", runShell, err))
			resp := ctl.Response{ExitCode: 127, Cwd: dir}
			o.finish(&resp)
			return resp
		}
		return ctl.Response{Error: fmt.Sprintf("start %s: %v", runShell, err)}
	}
	setAgentOOMScore(pid)
	s.run, s.runStatus = pid, nil
	defer func() { s.run, s.runStatus = 0, nil }()
	// The pump may have reaped it already (SIGCHLD races the assignment).
	s.reap()

	resp := ctl.Response{Cwd: dir}
	deadline := start.Add(timeout)
	var grace time.Time                                                 // after exit or kill: how long to wait for EOF
	open := map[int]int{outR: ctl.StreamStdout, errR: ctl.StreamStderr} // fd: stream
	for {
		if s.runStatus != nil && grace.IsZero() {
			// The script is done. What it left running in its process
			// group goes with it; descendants elsewhere get a second to
			// close the pipes.
			unix.Kill(-pid, unix.SIGKILL)
			grace = time.Now().Add(time.Second)
		}
		if s.runStatus != nil && len(open) == 0 {
			break
		}
		now := time.Now()
		if !grace.IsZero() && now.After(grace) {
			break
		}
		if grace.IsZero() && now.After(deadline) {
			resp.TimedOut = true
			unix.Kill(-pid, unix.SIGKILL)
			unix.Kill(pid, unix.SIGKILL)
			grace = now.Add(time.Second)
		}
		wait := time.Until(deadline)
		if !grace.IsZero() {
			wait = time.Until(grace)
		}
		fds := []unix.PollFd{{Fd: int32(s.wakeR), Events: unix.POLLIN}}
		for fd := range open {
			fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		unix.Poll(fds, int(max0(wait)/time.Millisecond)+1)
		s.drain(s.wakeR, nil, 0)
		for fd, stream := range open {
			if eof := s.drain(fd, o.to(stream), 0); eof {
				delete(open, fd)
			}
		}
		s.reap()
	}
	for fd, stream := range open {
		s.drain(fd, o.to(stream), 0)
	}
	for s.runStatus == nil {
		// Killed above, so it goes soon.
		unix.Kill(pid, unix.SIGKILL)
		s.pumpOnce(10*time.Millisecond, nil)
	}
	resp.Duration = time.Since(start)
	if resp.TimedOut {
		resp.ExitCode = 124
	} else {
		resp.ExitCode = exitCodeOf(*s.runStatus)
	}
	o.finish(&resp)
	return resp
}
