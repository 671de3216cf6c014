package initd

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// The descriptors on which the shell holds what init gave it: the command
// socket (init writes each command's text there, ended by a NUL), the
// stdout and stderr pipes of commands, and the status socket. They are
// high so that the agent's own redirections (exec 3>file) do not clobber
// them; a command that closes one anyway loses its status, times out and
// gets a fresh shell. The shell never opens anything of init's by path,
// so init can be non-dumpable (see Run), which closes /proc/1/fd to every
// process in the sandbox without CAP_SYS_PTRACE.
const (
	cmdFD    = ctl.ShellCmdFD
	outFD    = ctl.ShellOutFD
	errFD    = ctl.ShellErrFD
	statusFD = ctl.ShellStatusFD
)

// A job is one command waiting for, or running in, the shell. Its
// answer goes to out: output pieces, then the final Response.
type job struct {
	req ctl.Request
	out chan piece
}

// shell is the persistent shell on a pty, plus the pipes through which each
// command's stdout and stderr come back and the socket through which its
// status does. Only the pump goroutine touches it.
//
// Commands run with the two sockets closed, so nothing they start holds
// them; the shell's own saved copies can still be dup'ed by code the agent
// runs in the shell, which is why the checks below exist.
// Status records travel on a unix stream socket with SO_PASSCRED rather
// than on a pipe: a socket cannot be reopened through /proc/1/fd, and the
// kernel tells init which process wrote each chunk, so init keeps only
// what the shell itself wrote (printf is a builtin). Each record carries
// the command's random nonce and sequence number, typed in the same line
// as the command, so a record can only be accepted for the command it
// reports (see docs/sandbox.md, "Control channel and grader integrity").
type shell struct {
	path   string
	isBash bool
	// cfg is how every shell starts (ctl.Request.Shell): fixed once
	// started is set, and kept in init's memory, so a restored init
	// starts its shells as the dumped one did. started: the first
	// request came and a first shell was tried; up: one came up (from
	// then on nothing makes cfg.Dir, see makeDir); dir: where the
	// current shell started.
	cfg     ctl.Shell
	started bool
	up      bool
	dir     string
	pid     int
	master  int // pty master; -1 after hang-up until restart
	ptsN    int

	outR, outW int    // command stdout
	errR, errW int    // command stderr
	stR        int    // init's end of the status socket; -1 when closed
	cmdW       int    // init's end of the command socket
	cmdPeer    int    // init's copy of the shell's end, to drop leftovers
	pending    []byte // command text not yet written to cmdW
	wakeR      int    // written on SIGCHLD and on new jobs
	wakeW      int

	seq    uint64
	want   expected // records the current command waits for
	status []byte   // unterminated status bytes from the shell
	// rejected counts status chunks from other processes and records
	// nobody waits for.
	rejected int
	buf      []byte // drain's read buffer
	oob      []byte // credentials of a status chunk
	// lostIdle is set when the shell died between commands and had to be
	// replaced; the next command's response says so.
	lostIdle bool
	// startErr is why the last start failed ("" after one that worked;
	// while it is set, the shell is dead): init says so in every answer
	// (ShellError),
	// and the idle loop tries again at retryAt, backing off.
	startErr string
	retryAt  time.Time
	backoff  time.Duration
	restarts int
	lastExit string
	exited   *syscall.WaitStatus // set when the shell was reaped

	// run is the OpRun child being waited for (0: none) and runStatus
	// its status once reaped.
	run       int
	runStatus *syscall.WaitStatus
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

// newShell makes the pipes of a shell that is not started yet: the first
// request starts it (begin), with the config that request carries.
func newShell(path string) (*shell, error) {
	s := &shell{path: path, isBash: bytes.HasSuffix([]byte(path), []byte("bash")), master: -1, stR: -1, cmdW: -1, cmdPeer: -1, want: expected{}}
	var err error
	for _, p := range []struct{ r, w *int }{{&s.outR, &s.outW}, {&s.errR, &s.errW}, {&s.wakeR, &s.wakeW}} {
		if *p.r, *p.w, err = pipeNB(); err != nil {
			return nil, err
		}
	}
	if err := unix.SetNonblock(s.wakeW, true); err != nil {
		return nil, err
	}
	return s, nil
}

// begin is what init does with every request before its op: it takes
// the shell config the request carries (OpShell from sandbox.Start, the
// first request of a started init), and the first request starts the
// first shell. So the shell never runs with a config other than the one
// the server asked for: no default root shell comes first. A first start
// that fails is reported as ShellError and retried like a restart. The
// returned error refuses the request (a bad config, or one that differs
// from the one the shell started with).
func (s *shell) begin(req ctl.Request) error {
	if req.Shell != nil {
		if err := req.Shell.Validate(); err != nil {
			return fmt.Errorf("shell config: %w", err)
		}
		if s.started && !req.Shell.Equal(s.cfg) {
			return errors.New("shell config: the shell has started already; its config is fixed by the first request")
		}
		s.cfg = *req.Shell
	}
	if s.started {
		return nil
	}
	s.started = true
	if err := s.restart(); err != nil && s.exited == nil {
		// No shell ever ran: mark it dead so that the idle loop and the
		// next command try again (restart's back-off).
		s.exited = new(syscall.WaitStatus)
	}
	return nil
}

// wake makes the pump's poll return.
func (s *shell) wake() { unix.Write(s.wakeW, []byte{0}) }

// start launches the shell on a fresh pty and waits until it has run its
// set-up line. A pty that another process opened before init made it
// exclusive is thrown away for a new one (pty_linux.go), up to ptyTries
// times.
func (s *shell) start() error {
	if !s.up && s.cfg.Dir != "" {
		if err := makeDir(s.cfg.Dir, s.cfg.UID, s.cfg.GID); err != nil {
			return err
		}
	}
	for try := 1; ; try++ {
		err := s.startOn()
		if err == nil {
			s.up = true
		}
		if !errors.Is(err, errPtyTaken) {
			return err
		}
		if try == ptyTries {
			return fmt.Errorf("pty: %w, %d times in a row", err, ptyTries)
		}
	}
}

// restart replaces a dead shell: it drops the old terminal, starts a new
// shell and records the outcome for ShellError and the idle loop's
// back-off (restartBackoff up to restartBackoffMax between tries).
func (s *shell) restart() error {
	if s.master >= 0 {
		unix.Close(s.master)
		s.master = -1
	}
	err := s.start()
	if err == nil {
		s.startErr, s.backoff, s.retryAt = "", 0, time.Time{}
		return nil
	}
	s.startErr = err.Error()
	s.backoff = min(max(2*s.backoff, restartBackoff), restartBackoffMax)
	s.retryAt = time.Now().Add(s.backoff)
	return err
}

const (
	restartBackoff    = 100 * time.Millisecond
	restartBackoffMax = 5 * time.Second
)

// startOn is one try of start.
func (s *shell) startOn() error {
	p, err := openPty()
	if err != nil {
		return err
	}
	defer p.endWatch()
	master, slave, n := p.master, p.slave, p.n
	defer unix.Close(slave)
	stShell, err := s.newStatusSocket()
	if err != nil {
		unix.Close(master)
		return err
	}
	defer unix.Close(stShell)
	if err := s.newCommandSocket(); err != nil {
		unix.Close(master)
		return err
	}
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
	if !s.cfg.Root() {
		// The terminal belongs to the shell's user, as a login's does
		// (programs such as screen and mesg check); it stays exclusive,
		// so owning it opens it to nobody. Best effort: a sandbox
		// without CAP_CHOWN leaves it root's, and the shell uses the
		// descriptors it inherits either way.
		unix.Fchown(slave, int(s.cfg.UID), int(s.cfg.GID))
	}

	args := []string{"sh", "-i"}
	if s.isBash {
		args = []string{"bash", "--norc", "--noprofile", "--noediting", "-i"}
	}
	env := shellEnv(s.path, s.cfg.Env)
	// The shell gets the pty as 0 and 2, /dev/null as 1 and the
	// descriptors above; every other one below statusFD is closed. Its
	// stdout is never the terminal: every command's is the outFD pipe,
	// and busybox runs applets such as yes and head in a fork of the
	// shell without exec, with the shell's stdio state, which is line
	// buffered when stdout was a terminal at the shell's first write (a
	// write(2) per line: `yes | head -c 1000000` took 0.7 s instead of
	// 8 ms, see docs/sandbox.md, "Commands").
	files := make([]uintptr, statusFD+1)
	for i := range files {
		files[i] = ^uintptr(0)
	}
	null, err := unix.Open("/dev/null", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(master)
		return fmt.Errorf("open /dev/null: %w", err)
	}
	defer unix.Close(null)
	files[0], files[1], files[2] = uintptr(slave), uintptr(null), uintptr(slave)
	files[cmdFD], files[outFD], files[errFD], files[statusFD] = uintptr(s.cmdPeer), uintptr(s.outW), uintptr(s.errW), uintptr(stShell)
	// The shell's credentials (Credential: setgroups, setgid and setuid
	// in the child, after which the kernel clears a non-root uid's
	// permitted, effective and ambient capabilities; forkShell clears
	// the inheritable ones) and its directory: the config's, else /root.
	// A shell that cannot enter it starts in /: /root when it is missing
	// or not the user's to enter, the config's Dir when it is gone since
	// the first shell came up (see docs/sandbox.md, "The shell's user,
	// environment and directory"); the first shell in the config's Dir
	// gets no such fallback, so a Dir the user cannot enter fails
	// sandbox.Start.
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if !s.cfg.Root() {
		sys.Credential = &syscall.Credential{Uid: s.cfg.UID, Gid: s.cfg.GID, Groups: s.cfg.Groups}
	}
	dir, fallback := "/root", true
	if s.cfg.Dir != "" {
		dir, fallback = s.cfg.Dir, s.up
	}
	pid, err := forkShell(s.path, args, &syscall.ProcAttr{Dir: dir, Env: env, Files: files, Sys: sys}, s.cfg.UID != 0)
	if fallback && dir != "/" && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOTDIR)) {
		dir = "/"
		pid, err = forkShell(s.path, args, &syscall.ProcAttr{Dir: dir, Env: env, Files: files, Sys: sys}, s.cfg.UID != 0)
	}
	if err != nil {
		unix.Close(master)
		return fmt.Errorf("start %s in %s as %d:%d: %w", s.path, dir, s.cfg.UID, s.cfg.GID, err)
	}
	setAgentOOMScore(pid)
	s.pid, s.master, s.ptsN, s.exited, s.dir = pid, master, n, nil, dir
	clear(s.want)
	setup := "set +o history 2>/dev/null; unset HISTFILE ENV PROMPT_COMMAND; PS1=; PS2="
	if s.cfg.UID != 0 {
		// setAgentOOMScore writes a file of the shell's user, which
		// init cannot without CAP_DAC_OVERRIDE; the shell may raise its
		// own score (from init's -1000, which it inherits) itself.
		setup += "; echo " + agentOOMScore + " 2>/dev/null >/proc/self/oom_score_adj"
	}
	if s.isBash {
		// Commands do not fill the hash table (the Inspector's digest
		// reads it: a restore of an older image would lose what a
		// skipped turn put there); `hash` works again after set -h.
		setup += "; set +h"
	}
	if !s.isBash {
		// busybox ash, its terminal without echo, reads lines with
		// fgets, and a signal while it waits (SIGCHLD when a background
		// job ends or stops) makes the read fail, which ash takes for
		// end of input: it exited between commands and init replaced
		// it, losing its state. With ignoreeof it reads on (after up
		// to 50 such signals between two commands). See
		// docs/sandbox.md, "The shell".
		setup += "; set -o ignoreeof 2>/dev/null"
	}
	seq := s.type_(setup)
	deadline := time.Now().Add(setupWait)
	for {
		recs, dead := s.pumpOnce(time.Until(deadline), nil)
		if dead {
			return fmt.Errorf("shell %s exited during set-up (%s)", s.path, s.lastExit)
		}
		for _, r := range recs {
			if r.seq == seq {
				return s.checkPty(p)
			}
		}
		if time.Now().After(deadline) {
			// A shell that does not answer is no shell: kill it, so
			// that init never keeps reporting one that cannot run a
			// command, and let the caller try again.
			s.kill()
			return fmt.Errorf("shell %s did not answer its set-up line within %v (%d status chunks rejected)", s.path, setupWait, s.rejected)
		}
	}
}

// setupWait bounds how long a new shell may take to answer its set-up
// line.
const setupWait = 10 * time.Second

// kill kills the shell and waits until it is reaped.
func (s *shell) kill() {
	unix.Kill(s.pid, unix.SIGKILL)
	for s.exited == nil {
		s.pumpOnce(10*time.Millisecond, nil)
	}
}

// checkPty counts the opens of the new shell's terminal once more, now
// that the shell has answered its set-up line and before anything else is
// typed. When another process opened it, the shell is killed and the pty
// thrown away; that shell does not count as a restart.
func (s *shell) checkPty(p *pty) error {
	if !p.taken() {
		return nil
	}
	restarts, lastExit := s.restarts, s.lastExit
	s.kill()
	s.restarts, s.lastExit = restarts, lastExit
	if s.master >= 0 {
		unix.Close(s.master)
		s.master = -1
	}
	return errPtyTaken
}

// type_ writes one line into the shell, with the status record's printf
// at its end (the same line, so the shell has read the nonce before the
// command runs and a command cannot take the status line off the
// terminal), and returns the sequence number its status record will
// carry. An empty line types the printf alone (a marker).
func (s *shell) type_(line string) uint64 {
	s.seq++
	nonce := newNonce()
	s.want[s.seq] = nonce
	full := statusCmd(nonce, s.seq, statusFD) + "\n"
	if line != "" {
		// Clearing the text costs no command lookup and keeps a huge
		// command from staying in the shell's memory.
		full = line + "; " + statusCmd(nonce, s.seq, statusFD) + "; __arbor_cmd=\n"
	}
	s.writeMaster([]byte(full))
	return s.seq
}

// afterRestore puts back what a CRIU restore does not bring back: the
// terminal's exclusive mode and SO_PASSCRED on init's end of the status
// socket. The server's first request to a restored init is OpShell
// (sandbox.Restore), which runs it; a started init has both from the
// start. The exclusive mode is set through a transient descriptor of the
// slave, which fails with EBUSY when the terminal is exclusive already
// (init lacks CAP_SYS_ADMIN). The descriptor comes from the master
// (TIOCGPTPEER), not from /dev/pts/N: the slave of a non-root shell is
// its user's, mode 0620, which init could not open by path without
// CAP_DAC_OVERRIDE.
func (s *shell) afterRestore() {
	if s.stR >= 0 {
		unix.SetsockoptInt(s.stR, unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}
	if s.master < 0 {
		return
	}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(s.master), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC))
	if errno != 0 {
		return
	}
	unix.IoctlSetInt(int(fd), unix.TIOCEXCL, 0)
	unix.Close(int(fd))
}

// newStatusSocket makes a fresh status socket pair, keeps init's end in
// s.stR (non-blocking, SO_PASSCRED) and returns the shell's end, which the
// caller closes once the shell has it. A fresh pair per shell means a
// process that shut the old one down cannot silence the new shell.
func (s *shell) newStatusSocket() (int, error) {
	if s.stR >= 0 {
		unix.Close(s.stR)
		s.stR = -1
	}
	s.status = s.status[:0]
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("status socket: %w", err)
	}
	if err := unix.SetsockoptInt(p[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return -1, fmt.Errorf("status socket credentials: %w", err)
	}
	unix.SetNonblock(p[0], true)
	s.stR = p[0]
	return p[1], nil
}

// newCommandSocket makes a fresh command socket pair: init writes to
// cmdW and keeps a copy of the shell's end (cmdPeer) so that it can drop
// what a command interrupted mid-read left unread.
func (s *shell) newCommandSocket() error {
	for _, fd := range []*int{&s.cmdW, &s.cmdPeer} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("command socket: %w", err)
	}
	s.pending = s.pending[:0]
	// Only init's end is non-blocking: the shell's read must block.
	unix.SetNonblock(p[0], true)
	s.cmdW, s.cmdPeer = p[0], p[1]
	return nil
}

// sendCommand queues a command's text and its terminating NUL for the
// command socket; pumpOnce writes it as the shell reads, so a text larger
// than the socket's buffer neither blocks init nor holds up output and
// records (and a shell that never reads it cannot wedge init).
func (s *shell) sendCommand(cmd string) {
	s.pending = append(append(s.pending[:0], cmd...), 0)
	s.flushCommand()
}

// flushCommand writes what it can of the pending command text.
func (s *shell) flushCommand() {
	for len(s.pending) > 0 && s.cmdW >= 0 {
		n, err := unix.Write(s.cmdW, s.pending)
		if err != nil || n <= 0 {
			return
		}
		s.pending = s.pending[n:]
	}
}

// readStatus drains the status socket, keeping only bytes the shell
// process itself wrote. The kernel never merges chunks of different
// writers into one read on a SO_PASSCRED socket, and their pid cannot be
// forged without CAP_SYS_ADMIN.
func (s *shell) readStatus() {
	if s.stR < 0 {
		return
	}
	if s.oob == nil {
		s.oob = make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	}
	for {
		n, oobn, _, _, err := unix.Recvmsg(s.stR, s.buf, s.oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return
		}
		if n == 0 {
			// Every writer is gone (the shell died): stop polling a
			// socket that would report end of file forever.
			unix.Close(s.stR)
			s.stR = -1
			return
		}
		if senderPID(s.oob[:oobn]) != s.pid {
			s.rejected++
			continue
		}
		s.status = append(s.status, s.buf[:n]...)
	}
}

// senderPID returns the pid in a SCM_CREDENTIALS message (0 when absent).
func senderPID(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for i := range msgs {
		if c, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
			return int(c.Pid)
		}
	}
	return 0
}

func (s *shell) writeMaster(b []byte) {
	for len(b) > 0 && s.master >= 0 {
		n, err := unix.Write(s.master, b)
		if err == unix.EAGAIN || err == unix.EINTR {
			s.pumpOnce(10*time.Millisecond, nil)
			continue
		}
		if err != nil {
			return
		}
		b = b[n:]
	}
}

// pumpOnce polls every descriptor once (waiting at most d; forever when
// d < 0), hands command output to o (dropping it when o is nil), reaps
// children, and returns the status records that completed.
// dead reports that the shell has exited.
//
// Each descriptor gets at most drainBudget bytes read per call, so a
// command that writes without end cannot keep init from its status socket
// and its timeout; once a record has been read, though, everything in the
// output pipes is taken, since all the command wrote before its record is
// there by then.
func (s *shell) pumpOnce(d time.Duration, o *output) (recs []record, dead bool) {
	// A negative fd (no master, no status socket) is skipped by poll.
	fds := []unix.PollFd{
		{Fd: int32(s.outR), Events: unix.POLLIN},
		{Fd: int32(s.errR), Events: unix.POLLIN},
		{Fd: int32(s.stR), Events: unix.POLLIN},
		{Fd: int32(s.wakeR), Events: unix.POLLIN},
		{Fd: int32(s.master), Events: unix.POLLIN},
		{Fd: -1, Events: unix.POLLOUT},
	}
	if len(s.pending) > 0 {
		fds[5].Fd = int32(s.cmdW)
	}
	ms := -1
	if d >= 0 {
		ms = int((d + time.Millisecond - 1) / time.Millisecond)
	}
	if _, err := unix.Poll(fds, ms); err != nil && err != unix.EINTR {
		time.Sleep(time.Millisecond)
	}
	s.drain(s.outR, o.to(ctl.StreamStdout), 0)
	s.drain(s.errR, o.to(ctl.StreamStderr), 0)
	s.flushCommand()
	s.readStatus()
	s.drain(s.wakeR, nil, 0)
	// Holders of the shell's end of the command socket could fill init's
	// side with bytes nobody reads; drop them.
	s.drain(s.cmdW, nil, 0)
	if s.master >= 0 {
		s.drain(s.master, nil, 0)
		if fds[4].Revents&(unix.POLLHUP|unix.POLLERR) != 0 && fds[4].Revents&unix.POLLIN == 0 {
			unix.Close(s.master)
			s.master = -1
		}
	}
	s.reap()
	all, rest, junk := splitRecords(s.status)
	s.status = append(s.status[:0], rest...)
	s.rejected += junk
	for _, r := range all {
		if s.want.take(r) {
			recs = append(recs, r)
		} else {
			s.rejected++
		}
	}
	if len(recs) > 0 {
		// Output first: everything the command wrote precedes its status
		// record, so it is in the pipes now.
		s.drain(s.outR, o.to(ctl.StreamStdout), fionread(s.outR))
		s.drain(s.errR, o.to(ctl.StreamStderr), fionread(s.errR))
	}
	return recs, s.exited != nil
}

// drainBudget is how many bytes drain reads from a descriptor at most
// (beyond what it was asked to read at least) before it returns.
const drainBudget = 1 << 20

// drain reads fd (non-blocking) until it is empty or it has read
// max(least, drainBudget) bytes, handing what it reads to put, or
// dropping it when put is nil. It reports whether fd reached end of file.
func (s *shell) drain(fd int, put func([]byte), least int) (eof bool) {
	if s.buf == nil {
		s.buf = make([]byte, ctl.MaxChunk)
	}
	for got := 0; got < max(least, drainBudget); {
		n, err := unix.Read(fd, s.buf)
		if n > 0 {
			got += n
			if put != nil {
				put(s.buf[:n])
			}
			continue
		}
		return n == 0 && err == nil
	}
	return false
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
		if pid == s.run && s.run != 0 {
			w := ws
			s.runStatus = &w
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

// exec runs one command and returns its result; its output goes to o.
// The command text reaches the shell through the command socket, so no
// size limit of the terminal's line discipline applies, nothing is left on
// disk and nothing in the sandbox can rewrite it on the way (only init
// writes to that socket).
func (s *shell) exec(req ctl.Request, o *output) ctl.Response {
	if len(req.Cmd) > ctl.MaxCommand {
		return ctl.Response{Error: fmt.Sprintf("command is %d bytes, over the %d byte limit", len(req.Cmd), ctl.MaxCommand)}
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = ctl.DefaultTimeout
	}
	if strings.IndexByte(req.Cmd, 0) >= 0 {
		return ctl.Response{Error: "command contains a NUL byte"}
	}
	if s.exited != nil {
		// The shell died and was not replaced yet (or could not be:
		// startErr). Replace it now; the answer says the shell is new.
		s.lostIdle = true
		if err := s.restart(); err != nil {
			return ctl.Response{Error: fmt.Sprintf("no shell: %v", err)}
		}
	}
	// Whatever reached the pipes and the status socket since the last
	// command (a background job's late output, forged records) belongs
	// to no command: drop it before this one starts.
	s.pending = s.pending[:0]
	s.pumpOnce(0, nil)
	s.drain(s.outR, nil, fionread(s.outR))
	s.drain(s.errR, nil, fionread(s.errR))
	for s.cmdPeer >= 0 {
		if n, _, err := unix.Recvfrom(s.cmdPeer, s.buf, unix.MSG_DONTWAIT); n <= 0 || err != nil {
			break
		}
	}
	clear(s.want)
	rejected0 := s.rejected
	start := time.Now()
	// The shell reads the text from the command socket up to its NUL and
	// evals it in itself, so cd, variables and functions persist and its
	// messages read as at a terminal ("sh: x: not found"). "command"
	// keeps an error in the text (a syntax error, ${x?}) from abandoning
	// the rest of the line, the status printf; the backslashes keep
	// aliases out. The text never passes the terminal.
	// The command itself runs without the two sockets, so what it
	// starts does not inherit them.
	seq := s.type_(readCmd(len(req.Cmd)) + fmt.Sprintf(`; { \command eval "$__arbor_cmd"; } </dev/null >&%d 2>&%d %d<&- %d>&-`, outFD, errFD, cmdFD, statusFD))
	s.sendCommand(req.Cmd)
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
		recs, dead := s.pumpOnce(max0(wait), o)
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
			// SIGINT to the shell first, then the job: the shell must
			// have the interrupt pending when it sees its job die, or it
			// runs the rest of the line (`sleep 5; echo finished` printed
			// finished when init was preempted between the two kills).
			unix.Kill(s.pid, unix.SIGINT)
			s.killJob()
			firstMarker = s.type_("")
			lastInt, hard = now, now.Add(5*time.Second)
			continue
		}
		if firstMarker != 0 {
			if now.After(hard) {
				// The shell does not come back: replace it.
				unix.Kill(s.pid, unix.SIGKILL)
				for s.exited == nil {
					s.pumpOnce(10*time.Millisecond, o)
				}
				resp.ShellExited = true
				resp.ExitCode = 124
				break
			}
			// Later commands of the same line start new jobs: kill them
			// too. The shell itself gets SIGINT again only when it has
			// not come back for a second, with a fresh marker line, as a
			// SIGINT can also discard the marker line it is reading.
			if now.Sub(lastInt) > time.Second {
				unix.Kill(s.pid, unix.SIGINT)
				s.type_("")
				lastInt = now
			}
			s.killJob()
		}
	}
	resp.Duration = time.Since(start)
	resp.Rejected = s.rejected - rejected0
	restart := resp.ShellExited
	if s.lostIdle {
		resp.ShellExited, s.lostIdle = true, false
	}
	s.pumpOnce(0, o)
	o.finish(&resp)
	if restart {
		if err := s.restart(); err != nil {
			resp.Error = fmt.Sprintf("restart shell: %v", err)
		}
		if resp.Cwd == "" {
			resp.Cwd = s.dir
		}
	}
	return resp
}

// bigCommand is the size from which the shell reads a command's text with
// head rather than with its read builtin, which takes one system call per
// byte from a socket (about 1 ms per KiB in ash, 0.6 in bash).
const bigCommand = 2 << 10

// readCmd is the shell code that reads a command of n bytes from the
// command socket into $__arbor_cmd. A large one goes through head -c,
// which reads exactly n bytes in a few calls (the x keeps $(...) from
// eating trailing newlines); the NUL it leaves is dropped before the next
// command. Without head the builtin reads up to the NUL.
func readCmd(n int) string {
	read := fmt.Sprintf(`IFS= \command read -r -d '' __arbor_cmd <&%d`, cmdFD)
	if n < bigCommand {
		return read
	}
	return fmt.Sprintf(`if \command -v head >/dev/null 2>&1; then __arbor_cmd=$(\command head -c %d <&%d; echo x); __arbor_cmd=${__arbor_cmd%%x}; else %s; fi`, n, cmdFD, read)
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
