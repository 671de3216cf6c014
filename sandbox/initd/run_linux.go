package initd

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// Run is stage two: it starts the persistent shell, serves the control
// channel (package ctl), reports "ok" on the ready descriptor and serves
// forever.
func Run() error {
	// The shell must not inherit the server's pipe, nor either end of the
	// control channel.
	for _, fd := range []int{readyFD, ctl.ChannelFD, ctl.ServerEndFD} {
		syscall.CloseOnExec(fd)
	}
	ready := os.NewFile(readyFD, "ready")
	err := run(ready)
	if err != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
	}
	return err
}

func run(ready *os.File) error {
	// Non-dumpable: /proc/1/fd, /proc/1/mem, /proc/1/environ and ptrace
	// of init need CAP_SYS_PTRACE, which the sandbox's processes lack, so
	// none of them can reopen init's pipes or sockets. The shell needs
	// none of that: it inherits its descriptors. CRIU restores the flag.
	setNonDumpable()
	// Few threads: CRIU's dump time grows with every thread it seizes.
	runtime.GOMAXPROCS(1)
	prewarmThreads(4)
	path := "/bin/sh"
	for _, p := range bashPaths {
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	ignoreSignals()
	sh, err := newShell(path)
	if err != nil {
		return err
	}
	go func() {
		for range sigs {
			sh.wake()
		}
	}()
	ch, err := openChannel()
	if err != nil {
		return err
	}
	jobs := make(chan job, 64)
	if _, err := ready.Write([]byte("ok\n")); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	ready.Close()
	go func() {
		for {
			c, err := receiveConn(ch)
			if err != nil {
				// Only a broken channel fails here, and init holds both
				// of its ends: do not spin.
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if c == nil {
				continue
			}
			// A restore brings the flag back; setting it again is cheap.
			setNonDumpable()
			if err := checkPeer(c); err != nil {
				// Only the server, outside the sandbox's pid namespace,
				// may drive init: a connection made inside it gets this
				// line and nothing else.
				b, _ := json.Marshal(ctl.Response{Error: err.Error()})
				c.Write(append(b, '\n'))
				c.Close()
				continue
			}
			go serve(c, sh, jobs)
		}
	}()
	// The pump starts every shell, so it runs here, on the main thread
	// (see cmd/arbor-init): Linux re-parents orphans to init's main thread,
	// and CRIU requires a session leader (the shell) to come before the
	// other members of its session (orphaned background jobs) in the
	// order it walks init's threads' children.
	pump(sh, jobs)
	return nil
}

// openChannel wraps init's end of the control channel (ctl.ChannelFD)
// for the runtime's poller, so that waiting on it takes no OS thread. The
// wrapped descriptor is a copy: ChannelFD itself stays open, untouched,
// so the channel's two ends are always on their fixed numbers (an
// *os.File of it would close it when collected).
func openChannel() (*net.UnixConn, error) {
	fd, err := unix.FcntlInt(ctl.ChannelFD, unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control channel: %w", err)
	}
	f := os.NewFile(uintptr(fd), "arbor-ctl")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("control channel: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("control channel: descriptor %d is not a unix socket", ctl.ChannelFD)
	}
	return uc, nil
}

// receiveConn takes one connection the server sent on the channel: one
// byte with one descriptor (SCM_RIGHTS). It returns nil, nil for a message
// that carries no usable descriptor (closing whatever else came with it).
func receiveConn(ch *net.UnixConn) (net.Conn, error) {
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, err := ch.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) == 0 {
		return nil, nil
	}
	for _, fd := range fds[1:] {
		unix.Close(fd)
	}
	// Go asks for MSG_CMSG_CLOEXEC; make sure the shell never gets it.
	syscall.CloseOnExec(fds[0])
	f := os.NewFile(uintptr(fds[0]), "arbor-ctl-conn")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, nil
	}
	return c, nil
}

// ignoredSignals are every catchable signal a process in the sandbox
// could send init, but SIGCHLD (which init needs) and SIGTRAP (see
// ignoreSignals). Init is the pid
// namespace's init, so the kernel already drops signals from inside it
// that would take the default action; but the Go runtime installs
// handlers for most signals and then exits on SIGTERM, SIGHUP, SIGINT,
// SIGPIPE, SIGUSR1, SIGQUIT, a SIGSEGV sent with kill, and so on.
var ignoredSignals = []os.Signal{
	unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGILL, unix.SIGABRT, unix.SIGBUS,
	unix.SIGFPE, unix.SIGUSR1, unix.SIGSEGV, unix.SIGUSR2, unix.SIGPIPE, unix.SIGALRM, unix.SIGTERM,
	unix.SIGSTKFLT, unix.SIGXCPU, unix.SIGXFSZ, unix.SIGVTALRM, unix.SIGIO, unix.SIGPWR, unix.SIGSYS,
}

// ignoreSignals makes init survive every signal in ignoredSignals. They
// are caught and dropped rather than set to SIG_IGN, which children
// inherit across exec: the shell and the commands it runs must see
// SIGINT, SIGTERM and SIGPIPE as usual. (Go resets caught signals to the
// default in a forked child.) A caught SIGSEGV from kill(2) is dropped
// too; a real fault still crashes init, as it should.
//
// SIGTRAP alone is set back to SIG_DFL, past the Go runtime's handler:
// the kernel then drops it before it is queued, as for every signal that
// would take the default action on a namespace's init. Caught, a SIGTRAP
// sent just before a checkpoint's freeze stays pending on init's frozen
// thread, and CRIU refuses to dump a thread with a pending SIGTRAP
// (docs/sandbox.md, "What a checkpoint needs of the sandbox").
func ignoreSignals() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, ignoredSignals...)
	go func() {
		for range ch {
		}
	}()
	// The kernel's struct sigaction, all zero: handler SIG_DFL, no flags,
	// no restorer, empty mask. Should it fail, Sandbox.Freeze still waits
	// for init to handle a pending SIGTRAP.
	var dfl [4]uint64
	unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGTRAP), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
}

// setNonDumpable makes init non-dumpable (see run), except in user
// namespace mode: a restored init there has the host's user
// namespace as its memory's owner (CRIU forks it, nothing execs), and
// CRIU, which checks namespace ownership from inside the sandbox's user
// namespace, can then not open a non-dumpable init's namespaces, so the
// sandbox could be checkpointed once after each restore and never again.
// docs/security.md says what that leaves open in that mode.
func setNonDumpable() {
	if ownUserNS() {
		return
	}
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// ownUserNS is inOwnUserNS, read once (a sandbox never changes mode; an
// unreadable uid_map counts as user namespace mode, the safe side for
// CRIU).
var ownUserNS = sync.OnceValue(func() bool {
	own, err := inOwnUserNS()
	return err != nil || own
})

// checkPeer refuses a control connection from inside the sandbox. The
// server is outside init's pid namespace, so its pid reads 0 here; every
// process inside has a pid of its own. SO_PEERCRED is recorded by the
// kernel at connect time and cannot be forged.
func checkPeer(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return errors.New("control connection refused: not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("control connection refused: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return fmt.Errorf("control connection refused: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("control connection refused: peer credentials: %w", cerr)
	}
	if cred.Pid != 0 {
		return fmt.Errorf("control connection refused: peer pid %d is inside the sandbox; only the arbor server may connect", cred.Pid)
	}
	return nil
}

// prewarmThreads makes the Go runtime start n OS threads now. Idle threads
// are kept and reused, so init never needs a new one later, when a fork
// bomb may have used up the sandbox's pids limit and clone would fail.
func prewarmThreads(n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			unix.Nanosleep(&unix.Timespec{Nsec: 20e6}, nil)
		}()
	}
	wg.Wait()
}

// pump owns the shell: it runs jobs one at a time and, between them, keeps
// draining the pty and the pipes (background jobs may write to them) and
// reaping orphans.
func pump(sh *shell, jobs <-chan job) {
	for {
		select {
		case j := <-jobs:
			var resp ctl.Response
			o := &output{send: j.out}
			if err := sh.begin(j.req); err != nil {
				j.out <- piece{resp: ctl.Response{Error: err.Error()}}
				continue
			}
			switch j.req.Op {
			case ctl.OpExec:
				resp = sh.exec(j.req, o)
			case ctl.OpRun:
				resp = sh.runScript(j.req, o)
			case ctl.OpPing, ctl.OpShell:
				// The first request after a restore (see afterRestore).
				sh.afterRestore()
				resp = ctl.Response{ShellPID: sh.pid, ShellPath: sh.path, ShellRestarts: sh.restarts, LastExit: sh.lastExit, ShellError: sh.startErr}
			default:
				resp = ctl.Response{Error: fmt.Sprintf("unknown op %q", j.req.Op)}
			}
			j.out <- piece{resp: resp}
		default:
			wait := time.Duration(-1)
			if sh.exited != nil {
				// A dead shell that could not be replaced: try again at
				// retryAt (pumpOnce would report it dead at once).
				wait = max(0, time.Until(sh.retryAt))
			}
			_, dead := sh.pumpOnce(wait, nil)
			if dead && !time.Now().Before(sh.retryAt) {
				// The shell died between commands (killed from outside):
				// replace it so the sandbox stays usable. A failed start
				// is reported in every answer until one works.
				sh.lostIdle = true
				sh.restart()
			}
		}
	}
}

func serve(c net.Conn, sh *shell, jobs chan<- job) {
	defer c.Close()
	dec := json.NewDecoder(bufio.NewReader(c))
	enc := json.NewEncoder(c)
	for {
		var req ctl.Request
		if err := dec.Decode(&req); err != nil {
			return
		}
		if req.Op == ctl.OpDetach {
			enc.Encode(ctl.Response{})
			return
		}
		j := job{req: req, out: make(chan piece, inFlight)}
		jobs <- j // buffered: the pump may be asleep in poll
		sh.wake()
		// The job finishes even if the server hung up meanwhile: the
		// shell must come back to its prompt either way.
		if err := writePieces(c, j.out); err != nil {
			return
		}
	}
}
