package initd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// statusEnd terminates the status record the shell prints after each
// command: "SEQ EXIT PWD" then this byte.
const statusEnd = '\036'

// A job is one command waiting for, or running in, the shell.
type job struct {
	req  ctl.Request
	done chan ctl.Response
}

// shell is the persistent shell on a pty, plus the pipes through which each
// command's stdout, stderr and status come back. Only the pump goroutine
// touches it.
type shell struct {
	path   string
	isBash bool
	pid    int
	master int // pty master; -1 after hang-up until restart
	ptsN   int

	outR, outW int // command stdout
	errR, errW int // command stderr
	stR, stW   int // status records
	wakeR      int // written on SIGCHLD and on new jobs
	wakeW      int

	seq    uint64
	status []byte
	buf    []byte // drain's read buffer
	// lostIdle is set when the shell died between commands and had to be
	// replaced; the next command's response says so.
	lostIdle bool
	restarts int
	lastExit string
	exited   *syscall.WaitStatus // set when the shell was reaped
}

func pipeNB() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, fmt.Errorf("pipe: %w", err)
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		return -1, -1, err
	}
	return p[0], p[1], nil
}

func newShell(path string) (*shell, error) {
	s := &shell{path: path, isBash: bytes.HasSuffix([]byte(path), []byte("bash")), master: -1}
	var err error
	for _, p := range []struct{ r, w *int }{{&s.outR, &s.outW}, {&s.errR, &s.errW}, {&s.stR, &s.stW}, {&s.wakeR, &s.wakeW}} {
		if *p.r, *p.w, err = pipeNB(); err != nil {
			return nil, err
		}
	}
	if err := unix.SetNonblock(s.wakeW, true); err != nil {
		return nil, err
	}
	return s, s.start()
}

// wake makes the pump's poll return.
func (s *shell) wake() { unix.Write(s.wakeW, []byte{0}) }

// start launches the shell on a fresh pty and waits until it has run its
// set-up line.
func (s *shell) start() error {
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(master)
		return fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		unix.Close(master)
		return fmt.Errorf("pty number: %w", err)
	}
	slave, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(master)
		return fmt.Errorf("open pty slave: %w", err)
	}
	defer unix.Close(slave)
	tio, err := unix.IoctlGetTermios(slave, unix.TCGETS)
	if err != nil {
		unix.Close(master)
		return fmt.Errorf("get termios: %w", err)
	}
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ECHOE | unix.ECHOK
	if err := unix.IoctlSetTermios(slave, unix.TCSETS, tio); err != nil {
		unix.Close(master)
		return fmt.Errorf("set termios: %w", err)
	}
	unix.IoctlSetWinsize(slave, unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 200})
	unix.SetNonblock(master, true)

	args := []string{"sh", "-i"}
	if s.isBash {
		args = []string{"bash", "--norc", "--noprofile", "--noediting", "-i"}
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "TERM=dumb", "LANG=C.UTF-8", "PS1=", "PS2=", "SHELL=" + s.path,
	}
	pid, err := syscall.ForkExec(s.path, args, &syscall.ProcAttr{
		Dir:   "/root",
		Env:   env,
		Files: []uintptr{uintptr(slave), uintptr(slave), uintptr(slave)},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	})
	if errors.Is(err, unix.ENOENT) {
		pid, err = syscall.ForkExec(s.path, args, &syscall.ProcAttr{
			Dir: "/", Env: env,
			Files: []uintptr{uintptr(slave), uintptr(slave), uintptr(slave)},
			Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
		})
	}
	if err != nil {
		unix.Close(master)
		return fmt.Errorf("start %s: %w", s.path, err)
	}
	// init is protected from the OOM killer; the shell and what it runs are not.
	os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("0"), 0)
	s.pid, s.master, s.ptsN, s.exited = pid, master, n, nil
	setup := "set +o history 2>/dev/null; unset HISTFILE ENV PROMPT_COMMAND; PS1=; PS2="
	seq := s.type_(setup)
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, dead := s.pumpOnce(time.Until(deadline), nil, nil)
		if dead {
			return fmt.Errorf("shell %s exited during set-up", s.path)
		}
		for _, r := range recs {
			if r.seq == seq {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shell %s did not answer its set-up line", s.path)
		}
	}
}

// type_ writes one line into the shell followed by the status printf, and
// returns the sequence number its status record will carry.
func (s *shell) type_(line string) uint64 {
	s.seq++
	full := fmt.Sprintf("%s\nprintf '%%s %%s %%s\\036' %d \"$?\" \"$PWD\" >/proc/1/fd/%d\n", line, s.seq, s.stW)
	if line == "" {
		full = fmt.Sprintf("printf '%%s %%s %%s\\036' %d \"$?\" \"$PWD\" >/proc/1/fd/%d\n", s.seq, s.stW)
	}
	s.writeMaster([]byte(full))
	return s.seq
}

func (s *shell) writeMaster(b []byte) {
	for len(b) > 0 && s.master >= 0 {
		n, err := unix.Write(s.master, b)
		if err == unix.EAGAIN || err == unix.EINTR {
			s.pumpOnce(10*time.Millisecond, nil, nil)
			continue
		}
		if err != nil {
			return
		}
		b = b[n:]
	}
}

type record struct {
	seq  uint64
	code int
	pwd  string
}

// pumpOnce polls every descriptor once (waiting at most d; forever when
// d < 0), moves command output into out and errb (discarding it when they
// are nil), reaps children, and returns the status records that completed.
// dead reports that the shell has exited.
func (s *shell) pumpOnce(d time.Duration, out, errb *ctl.CapBuffer) (recs []record, dead bool) {
	fds := []unix.PollFd{
		{Fd: int32(s.outR), Events: unix.POLLIN},
		{Fd: int32(s.errR), Events: unix.POLLIN},
		{Fd: int32(s.stR), Events: unix.POLLIN},
		{Fd: int32(s.wakeR), Events: unix.POLLIN},
		{Fd: int32(s.master), Events: unix.POLLIN},
	}
	if s.master < 0 {
		fds = fds[:4]
	}
	ms := -1
	if d >= 0 {
		ms = int((d + time.Millisecond - 1) / time.Millisecond)
	}
	if _, err := unix.Poll(fds, ms); err != nil && err != unix.EINTR {
		time.Sleep(time.Millisecond)
	}
	// Output first: everything the command wrote precedes its status record.
	s.drain(s.outR, capOrDiscard(out))
	s.drain(s.errR, capOrDiscard(errb))
	s.drain(s.stR, func(p []byte) { s.status = append(s.status, p...) })
	s.drain(s.wakeR, nil)
	if s.master >= 0 {
		s.drain(s.master, nil)
		if fds[4].Revents&(unix.POLLHUP|unix.POLLERR) != 0 && fds[4].Revents&unix.POLLIN == 0 {
			unix.Close(s.master)
			s.master = -1
		}
	}
	s.reap()
	for {
		i := bytes.IndexByte(s.status, statusEnd)
		if i < 0 {
			break
		}
		rec := s.status[:i]
		s.status = s.status[i+1:]
		f := bytes.SplitN(rec, []byte(" "), 3)
		if len(f) != 3 {
			continue
		}
		seq, _ := strconv.ParseUint(string(f[0]), 10, 64)
		code, _ := strconv.Atoi(string(f[1]))
		recs = append(recs, record{seq: seq, code: code, pwd: string(f[2])})
	}
	return recs, s.exited != nil
}

// capOrDiscard is where drain puts a stream: b, or nowhere when no
// command is collecting it.
func capOrDiscard(b *ctl.CapBuffer) func([]byte) {
	if b == nil {
		return nil
	}
	return func(p []byte) { b.Write(p) }
}

// drain reads fd (non-blocking) until it is empty, handing what it reads to
// put, or dropping it when put is nil.
func (s *shell) drain(fd int, put func([]byte)) {
	if s.buf == nil {
		s.buf = make([]byte, 64<<10)
	}
	for {
		n, err := unix.Read(fd, s.buf)
		if n > 0 && put != nil {
			put(s.buf[:n])
		}
		if err != nil || n <= 0 {
			return
		}
	}
}

// reap collects every exited child of init: the shell and orphans that
// were re-parented to pid 1.
func (s *shell) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		if pid == s.pid {
			w := ws
			s.exited = &w
			s.restarts++
			if ws.Signaled() {
				s.lastExit = "signal: " + ws.Signal().String()
			} else {
				s.lastExit = fmt.Sprintf("exit status %d", ws.ExitStatus())
			}
		}
	}
}

// killJob kills the terminal's foreground process group when it is a job
// of its own (the command that outlived its timeout), not the shell. With
// a SIGINT to the shell, as ^C at a terminal, this also stops a loop
// running inside the shell itself and abandons the rest of the line.
func (s *shell) killJob() {
	if s.master >= 0 {
		if pg, err := unix.IoctlGetInt(s.master, unix.TIOCGPGRP); err == nil && pg > 1 && pg != s.pid {
			unix.Kill(-pg, unix.SIGKILL)
		}
	}
}

// exec runs one command and returns its result. The command text reaches
// the shell through a memfd it sources via /proc/1/fd, so no size limit of
// the terminal's line discipline applies and nothing is left on disk.
func (s *shell) exec(req ctl.Request) ctl.Response {
	if len(req.Cmd) > ctl.MaxCommand {
		return ctl.Response{Error: fmt.Sprintf("command is %d bytes, over the %d byte limit", len(req.Cmd), ctl.MaxCommand)}
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = ctl.DefaultTimeout
	}
	max := req.MaxOutput
	if max <= 0 {
		max = ctl.DefaultMaxOutput
	}
	mfd, err := unix.MemfdCreate("arbor-cmd", unix.MFD_CLOEXEC)
	if err != nil {
		return ctl.Response{Error: fmt.Sprintf("memfd: %v", err)}
	}
	defer unix.Close(mfd)
	if _, err := unix.Write(mfd, []byte(req.Cmd)); err != nil {
		return ctl.Response{Error: fmt.Sprintf("write command: %v", err)}
	}
	out, errb := ctl.NewCapBuffer(max), ctl.NewCapBuffer(max)
	start := time.Now()
	// bash reads the text with $(<file), which costs no fork, and evals
	// it, so its messages read as they would at a terminal ("bash: x:
	// command not found"); other shells source it.
	src := fmt.Sprintf(". /proc/1/fd/%d", mfd)
	if s.isBash {
		src = fmt.Sprintf(`eval "$(</proc/1/fd/%d)"`, mfd)
	}
	seq := s.type_(fmt.Sprintf("{ %s; } </dev/null >/proc/1/fd/%d 2>/proc/1/fd/%d", src, s.outW, s.errW))
	resp := ctl.Response{}
	deadline := start.Add(timeout)
	// After a timeout, init types marker lines; the first marker record
	// to come back (any sequence number from firstMarker on) means the
	// shell is at its prompt again.
	var firstMarker uint64
	var hard, lastInt time.Time
	got := false
	for {
		wait := time.Until(deadline)
		if firstMarker != 0 {
			wait = 50 * time.Millisecond
		}
		recs, dead := s.pumpOnce(max0(wait), out, errb)
		back := false
		for _, r := range recs {
			switch {
			case r.seq == seq:
				got = true
				resp.ExitCode, resp.Cwd = r.code, r.pwd
			case firstMarker != 0 && r.seq >= firstMarker:
				back = true
				if !got {
					resp.ExitCode, resp.Cwd = 124, r.pwd
				}
			}
		}
		if dead {
			resp.ShellExited = true
			if !got {
				resp.ExitCode = exitCodeOf(*s.exited)
			}
			break
		}
		if (got && firstMarker == 0) || back {
			break
		}
		now := time.Now()
		if firstMarker == 0 && now.After(deadline) {
			resp.TimedOut = true
			s.killJob()
			unix.Kill(s.pid, unix.SIGINT)
			firstMarker = s.type_("")
			lastInt, hard = now, now.Add(5*time.Second)
			continue
		}
		if firstMarker != 0 {
			if now.After(hard) {
				// The shell does not come back: replace it.
				unix.Kill(s.pid, unix.SIGKILL)
				for s.exited == nil {
					s.pumpOnce(10*time.Millisecond, out, errb)
				}
				resp.ShellExited = true
				resp.ExitCode = 124
				break
			}
			// Later commands of the same line start new jobs: kill them
			// too. The shell itself gets SIGINT again only when it has
			// not come back for a second, with a fresh marker line, as a
			// SIGINT can also discard the marker line it is reading.
			s.killJob()
			if now.Sub(lastInt) > time.Second {
				unix.Kill(s.pid, unix.SIGINT)
				s.type_("")
				lastInt = now
			}
		}
	}
	resp.Duration = time.Since(start)
	restart := resp.ShellExited
	if s.lostIdle {
		resp.ShellExited, s.lostIdle = true, false
	}
	s.pumpOnce(0, out, errb)
	resp.Stdout, resp.Stderr = out.Bytes(), errb.Bytes()
	resp.StdoutBytes, resp.StderrBytes = out.Total(), errb.Total()
	resp.Truncated = out.Truncated() || errb.Truncated()
	if restart {
		if s.master >= 0 {
			unix.Close(s.master)
			s.master = -1
		}
		if err := s.start(); err != nil {
			resp.Error = fmt.Sprintf("restart shell: %v", err)
		}
		if resp.Cwd == "" {
			resp.Cwd = "/root"
		}
	}
	return resp
}

func max0(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}

func exitCodeOf(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
