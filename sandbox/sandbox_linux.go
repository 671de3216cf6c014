package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/ctl"
	"github.com/arbor-env/arbor/sandbox/seccomp"
)

// Sandbox is one running sandbox. Its methods are safe for concurrent use;
// commands run one at a time.
type Sandbox struct {
	cfg    Config
	log    *slog.Logger
	cg     *cgroup
	pid    int           // host pid of init
	exited chan struct{} // closed when init has been reaped

	mu       sync.Mutex // serialises commands and connection use
	conn     net.Conn
	rd       *bufio.Reader
	shellPID int // shell pid inside the sandbox's pid namespace
	// ch is the server's copy of init's control channel (takeChannel),
	// -1 before it is taken and once the sandbox is destroyed.
	ch       int
	seen     counters
	diskFull bool // the root was at its quota at the last check
	closed   bool
	// iso is what the sandbox was started (or restored) to hold: hardened
	// or not, and the capability set kept.
	iso IsolationRecord

	hmu  sync.Mutex  // guards held and gone; a leaf, never held across a call
	held []io.Closer // closed by Destroy after the processes are killed (Hold)
	gone bool        // Destroy closed held
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// FindInit locates the arbor-init binary: $ARBOR_INIT, else arbor-init next
// to the running executable, else bin/arbor-init below the working
// directory.
func FindInit() (string, error) {
	var cands []string
	if p := os.Getenv("ARBOR_INIT"); p != "" {
		cands = append(cands, p)
	}
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "arbor-init"))
	}
	cands = append(cands, "bin/arbor-init")
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return filepath.Abs(c)
		}
	}
	return "", fmt.Errorf("%w: arbor-init not found (looked in %s): run make build or set ARBOR_INIT", ErrUnsupported, strings.Join(cands, ", "))
}

// installInit copies the init binary to root/.arbor/init unless an
// identical copy is already there.
func installInit(src, root string) error {
	want, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read init binary: %w", err)
	}
	dir := filepath.Join(root, ctl.Dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	dst := filepath.Join(root, ctl.InitPath)
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, want) {
		return nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, want, 0o755); err != nil {
		return fmt.Errorf("install init: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("install init: %w", err)
	}
	return nil
}

// Start boots a sandbox on cfg.Root and waits until its shell is ready.
// On failure nothing is left behind (the root itself belongs to the caller).
func Start(ctx context.Context, cfg Config) (sb *Sandbox, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: sandboxes need root", ErrUnsupported)
	}
	if !idPattern.MatchString(cfg.ID) {
		return nil, fmt.Errorf("sandbox id %q: want 1-64 letters, digits, - or _", cfg.ID)
	}
	if cfg.Hostname == "" {
		cfg.Hostname = "arbor"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.InitBinary == "" {
		if cfg.InitBinary, err = FindInit(); err != nil {
			return nil, err
		}
	}
	kept, err := cfg.Isolation.KeptCaps()
	if err != nil {
		return nil, err
	}
	if err := cfg.Shell.check(cfg.UserNS, kept); err != nil {
		return nil, err
	}
	hardened := !cfg.Isolation.Unhardened
	capsArg := "unhardened"
	var prog *os.File
	if hardened {
		capsArg = strconv.FormatUint(uint64(kept), 16)
		if prog, err = seccompFile(kept, cfg.Logger); err != nil {
			return nil, err
		}
		defer prog.Close()
	}
	if err := installInit(cfg.InitBinary, cfg.Root); err != nil {
		return nil, err
	}
	cfg.UserNS = cfg.UserNS.WithDefaults() // user namespace mode: userns_linux.go
	uns, err := prepareUserNS(cfg.Root, cfg.UserNS)
	if err != nil {
		return nil, err
	}
	defer uns.close()
	cg, err := newCgroup("arbor/"+cfg.ID, cfg.Limits, hardened)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{cfg: cfg, cg: cg, ch: -1, exited: make(chan struct{}), log: cfg.Logger.With(slog.String("sandbox", cfg.ID)),
		iso: IsolationRecord{Hardened: hardened, Caps: kept}}
	defer func() {
		if err != nil {
			if derr := s.Destroy(context.Background()); derr != nil {
				s.log.Warn("clean up failed start", slog.Any("err", derr))
			}
		}
	}()

	syncR, syncW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pipe: %w", err)
	}
	defer syncW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		syncR.Close()
		return nil, fmt.Errorf("pipe: %w", err)
	}
	defer readyR.Close()
	var cmd *exec.Cmd
	// A fork elsewhere in the process can briefly hold the freshly
	// written init binary open for writing (until that child execs), so
	// exec fails with ETXTBSY: retry, as Go's own os/exec tests do.
	for try := 0; ; try++ {
		cmd = exec.Command(filepath.Join(cfg.Root, ctl.InitPath), "setup", cfg.Root, cfg.Hostname, capsArg)
		cmd.ExtraFiles = []*os.File{syncR, readyW}
		if prog != nil {
			// fd 5: the seccomp program, read once by stage one.
			if _, err := prog.Seek(0, io.SeekStart); err != nil {
				syncR.Close()
				readyW.Close()
				close(s.exited)
				return nil, fmt.Errorf("rewind seccomp program: %w", err)
			}
			cmd.ExtraFiles = append(cmd.ExtraFiles, prog)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
			// A crashed server leaves no sandbox behind: killing pid 1 of a
			// pid namespace kills everything in it.
			Pdeathsig: syscall.SIGKILL,
			// The session (and so the shell's process groups) must live
			// inside the pid namespace, or CRIU cannot dump it.
			Setsid: true,
		}
		uns.apply(cmd.SysProcAttr) // user namespace mode: userns_linux.go
		err = uns.start(cmd)
		if !errors.Is(err, syscall.ETXTBSY) || try == 50 {
			break
		}
		time.Sleep(time.Duration(try+1) * 2 * time.Millisecond)
	}
	syncR.Close()
	readyW.Close()
	if err != nil {
		close(s.exited)
		return nil, fmt.Errorf("start init: %w", err)
	}
	s.pid = cmd.Process.Pid
	// reap, not cmd.Wait: no OS thread per sandbox (reap_linux.go). cmd
	// has no pipes of its own to close.
	cmd.Process.Release()
	go func() {
		reap(s.pid)
		close(s.exited)
	}()
	if err := cg.add(s.pid); err != nil {
		return nil, fmt.Errorf("place init in cgroup: %w", err)
	}
	if _, err := syncW.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("release init: %w", err)
	}
	if err := waitReady(ctx, readyR); err != nil {
		return nil, err
	}
	if err := checkUIDMap(s.pid, cfg.UserNS); err != nil { // userns_linux.go
		return nil, err
	}
	if err := s.takeChannel(); err != nil {
		return nil, err
	}
	s.seen = cg.counters()
	// Init starts its first shell at this request, with this config
	// (ctl.Request.Shell), and every later one with the same. A start
	// waits up to 10 s for a shell that does not answer, per pty tried.
	shell := cfg.Shell.wire()
	resp, err := s.call(ctx, ctl.Request{Op: ctl.OpShell, Shell: &shell}, 30*time.Second)
	if err != nil {
		return nil, err
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("start the shell: %s", resp.Error)
	}
	if resp.ShellError != "" {
		return nil, fmt.Errorf("start the shell: %s", resp.ShellError)
	}
	s.shellPID = resp.ShellPID
	rec, err := s.readIsolation()
	if err != nil {
		return nil, err
	}
	if err := rec.CheckPolicy(cfg.Isolation); err != nil {
		return nil, fmt.Errorf("started sandbox: %w", err)
	}
	s.log.Debug("sandbox started", slog.Int("init_pid", s.pid), slog.String("shell", resp.ShellPath))
	return s, nil
}

// seccompFile compiles (or takes from the cache) the filter for a sandbox
// keeping caps and puts it in a memfd, which init gets as a descriptor:
// nothing is written into the root, so no snapshot or restored child ever
// sees it, and nothing in the sandbox can change it before it is loaded.
func seccompFile(caps CapSet, log *slog.Logger) (*os.File, error) {
	p, err := seccomp.Compile(caps.Names(), log)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrIsolation, err)
	}
	fd, err := unix.MemfdCreate("arbor-seccomp", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("seccomp program: %w", err)
	}
	f := os.NewFile(uintptr(fd), "arbor-seccomp")
	if _, err := f.Write(p.BPF); err != nil {
		f.Close()
		return nil, fmt.Errorf("seccomp program: %w", err)
	}
	return f, nil
}

// readIsolation reads what init and the shell hold now
// (/proc/PID/status), with the expectation the sandbox was made with.
func (s *Sandbox) readIsolation() (IsolationRecord, error) {
	rec := IsolationRecord{Hardened: s.iso.Hardened, Caps: s.iso.Caps}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return rec, fmt.Errorf("%w: read init status: %v", ErrIsolation, err)
	}
	if rec.Init, err = ParseTaskIsolation(b); err != nil {
		return rec, fmt.Errorf("init: %w", err)
	}
	if s.shellPID <= 0 {
		return rec, nil
	}
	host, err := s.hostPID(s.shellPID)
	if err != nil {
		// The shell died between commands and init replaced it; the next
		// command learns its pid. Init alone is recorded.
		s.log.Debug("isolation record without the shell", slog.Any("err", err))
		return rec, nil
	}
	if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", host)); err != nil {
		s.log.Debug("isolation record without the shell", slog.Any("err", err))
		return rec, nil
	}
	if rec.Shell, err = ParseTaskIsolation(b); err != nil {
		return rec, fmt.Errorf("shell: %w", err)
	}
	rec.ShellPID = s.shellPID
	return rec, nil
}

// hostPID finds the host pid of init's child whose pid in the sandbox is
// ns, from the children of init's threads (the shell is forked from the
// main thread, the first listed).
func (s *Sandbox) hostPID(ns int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", s.pid))
	if err != nil {
		return 0, fmt.Errorf("threads of init: %w", err)
	}
	var kids []string
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", s.pid, t.Name()))
		if err != nil {
			continue
		}
		if t.Name() == strconv.Itoa(s.pid) {
			kids = append(strings.Fields(string(b)), kids...)
		} else {
			kids = append(kids, strings.Fields(string(b))...)
		}
	}
	for _, f := range kids {
		p, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if n, _ := nsPID(p); n == ns {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no child of init has pid %d in the sandbox", ns)
}

// Isolation reads what the sandbox's init and shell hold now and checks
// it against the policy the sandbox was started under; a checkpoint
// stores it next to the process image (WriteIsolationRecord) so every
// restore can be compared with it. Call it with the sandbox frozen or
// exclusive.
func (s *Sandbox) Isolation() (IsolationRecord, error) {
	rec, err := s.readIsolation()
	if err != nil {
		return rec, err
	}
	return rec, rec.CheckPolicy(Isolation{Unhardened: !rec.Hardened, Caps: rec.Caps.Names(), AllowExtraCaps: true})
}

// waitReady reads init's "ok" line (or its error) from the ready pipe.
func waitReady(ctx context.Context, r *os.File) error {
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		line, err := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
		ch <- res{strings.TrimSpace(line), err}
	}()
	select {
	case <-ctx.Done():
		return fmt.Errorf("wait for sandbox init: %w", ctx.Err())
	case <-time.After(30 * time.Second):
		return fmt.Errorf("wait for sandbox init: %w", ErrTimeout)
	case r := <-ch:
		switch {
		case r.line == "ok":
			return nil
		case r.line == "":
			return fmt.Errorf("sandbox init exited before it was ready (%v)", r.err)
		default:
			return fmt.Errorf("sandbox init: %s", strings.TrimPrefix(r.line, "error: "))
		}
	}
}

// ID returns the sandbox id.
func (s *Sandbox) ID() string { return s.cfg.ID }

// Root returns the host path of the sandbox root.
func (s *Sandbox) Root() string { return s.cfg.Root }

// InitPID returns init's pid on the host.
func (s *Sandbox) InitPID() int { return s.pid }

// CgroupID returns the id of the sandbox's v2 cgroup, the key eBPF
// programs filter on.
func (s *Sandbox) CgroupID() (uint64, error) { return s.cg.ID() }

// Exited is closed when the sandbox's init has exited.
func (s *Sandbox) Exited() <-chan struct{} { return s.exited }

// Memory is what the sandbox's memory cgroup charges now.
func (s *Sandbox) Memory() (Memory, error) { return s.cg.memory() }

// Hold ties c to the sandbox's life: Destroy closes it once the
// sandbox's processes are killed (a lazy restore's page daemon, which must
// outlive the tree it serves, and no more). On a sandbox already destroyed
// c is closed at once. When c is Failing and fails, every later command
// fails with ErrDead and the sandbox is killed.
func (s *Sandbox) Hold(c io.Closer) {
	s.hmu.Lock()
	if !s.gone {
		s.held = append(s.held, c)
		s.hmu.Unlock()
		return
	}
	s.hmu.Unlock()
	if err := c.Close(); err != nil {
		s.log.Warn("close what the sandbox held", slog.Any("err", err))
	}
}

// Kill ends every process of the sandbox (SIGKILL to its cgroup) without
// destroying it: its init exits, so the next command finds it dead
// (ErrDead) and the engine revives it. For a tree that must not run on
// (the daemon serving its memory failed).
func (s *Sandbox) Kill() {
	s.cg.kill()
	select {
	case <-s.exited:
		return // reaped: its pid may be another process's by now
	default:
	}
	if s.pid > 0 {
		syscall.Kill(s.pid, syscall.SIGKILL)
	}
}

// Failing is what the sandbox's processes depend on and a Hold value
// reports as failed (Err non-nil while the sandbox is not destroyed).
type Failing interface {
	io.Closer
	Err() error
}

// Err is the failure of a Failing value the sandbox holds: then its
// processes cannot be trusted (a lazy restore's daemon died with pages
// still to serve, which then read as zeros), so the sandbox is killed and
// Err wraps ErrDead: a command that ran meanwhile has no result. Callers
// that read the processes' state from outside (a checkpoint's dump) check
// it after doing so.
func (s *Sandbox) Err() error {
	s.hmu.Lock()
	var err error
	for _, c := range s.held {
		if f, ok := c.(Failing); ok {
			if err = f.Err(); err != nil {
				break
			}
		}
	}
	s.hmu.Unlock()
	if err == nil {
		return nil
	}
	s.Kill()
	return fmt.Errorf("%w: %w", ErrDead, err)
}

// Pending is a Hold value whose work on the sandbox's processes goes on
// after it was handed over (a lazy restore's daemon copying their memory
// in) and can be waited for.
type Pending interface {
	Wait(ctx context.Context) error
}

// WaitHeld waits until every Pending value the sandbox holds is done, or
// ctx ends. A dump must: what a lazy restore's daemon has not copied in
// yet is absent from the processes' page tables, and CRIU dumps an absent
// page as never touched, so its image would hold zeros there.
func (s *Sandbox) WaitHeld(ctx context.Context) error {
	s.hmu.Lock()
	var ps []Pending
	for _, c := range s.held {
		if p, ok := c.(Pending); ok {
			ps = append(ps, p)
		}
	}
	s.hmu.Unlock()
	for _, p := range ps {
		if err := p.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// closeHeld closes what Hold gave the sandbox, once.
func (s *Sandbox) closeHeld() {
	s.hmu.Lock()
	held := s.held
	s.held, s.gone = nil, true
	s.hmu.Unlock()
	for _, c := range held {
		if err := c.Close(); err != nil {
			s.log.Warn("close what the sandbox held", slog.Any("err", err))
		}
	}
}

// takeChannel copies the server's end of init's control channel
// (ctl.ServerEndFD) out of init's descriptor table (pidfd_getfd, which
// needs ptrace rights over init: the server has them, the sandbox's
// processes do not) and checks that it is a unix socket whose pair init
// made (SO_PEERCRED of a socket pair is its maker's). A started init made
// it in stage one; a restored one holds the pair CRIU brought back. The
// copy is close-on-exec.
func (s *Sandbox) takeChannel() error {
	pfd, err := unix.PidfdOpen(s.pid, 0)
	if err != nil {
		return fmt.Errorf("take the control channel of init (pid %d): %w", s.pid, err)
	}
	defer unix.Close(pfd)
	if !s.alive() {
		// Reaped before the pidfd was made: the pid may be another's.
		return fmt.Errorf("take the control channel of init (pid %d): %w", s.pid, ErrDead)
	}
	fd, err := unix.PidfdGetfd(pfd, ctl.ServerEndFD, 0)
	if err != nil {
		return fmt.Errorf("take the control channel of init (pid %d, descriptor %d): %w", s.pid, ctl.ServerEndFD, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return fmt.Errorf("%w: descriptor %d of init (pid %d) is not a socket", ErrImpostor, ctl.ServerEndFD, s.pid)
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("take the control channel of init (pid %d): peer credentials: %w", s.pid, err)
	}
	if int(cred.Pid) != s.pid {
		unix.Close(fd)
		return fmt.Errorf("%w: the control channel of sandbox %s was made by pid %d, not by its init (pid %d)", ErrImpostor, s.cfg.ID, cred.Pid, s.pid)
	}
	s.ch = fd
	return nil
}

// dial makes a connection to init: a fresh socket pair whose one end it
// sends init over the control channel. Nothing inside the sandbox can
// remove, replace or listen in on that channel, so a process there can
// neither stop the server from reaching init nor pose as it.
func (s *Sandbox) dial(ctx context.Context) error {
	if s.ch < 0 {
		return fmt.Errorf("connect to sandbox init: %w", ErrClosed)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("connect to sandbox init: %w", err)
	}
	// Init takes each connection at once; a full channel means it does
	// not, and the server must not wait on it here.
	err = unix.Sendmsg(s.ch, []byte{0}, unix.UnixRights(fds[1]), nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	unix.Close(fds[1])
	if err != nil {
		unix.Close(fds[0])
		if !s.alive() {
			return fmt.Errorf("connect to sandbox init: %w", ErrDead)
		}
		return fmt.Errorf("connect to sandbox init: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "arbor-ctl")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("connect to sandbox init: %w", err)
	}
	s.conn, s.rd = c, bufio.NewReader(c)
	return nil
}

// Disconnect closes the server's connection to init, so that no descriptor
// points into the sandbox from outside (CRIU dumps need this). The next
// command dials again.
func (s *Sandbox) Disconnect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disconnect()
}

func (s *Sandbox) disconnect() {
	if s.conn == nil {
		return
	}
	// Ask init to close its end and wait until it has: a dump right after
	// must not find init's end of this connection still open.
	s.conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := s.conn.Write([]byte(`{"op":"detach"}` + "\n")); err == nil {
		io.Copy(io.Discard, s.rd)
	}
	s.conn.Close()
	s.conn, s.rd = nil, nil
}

// call sends one request; the caller holds s.mu or has exclusive access.
func (s *Sandbox) call(ctx context.Context, req ctl.Request, wait time.Duration) (ctl.Response, error) {
	return s.exchange(ctx, req, wait, nil, nil)
}

// exchange sends one request and reads its answer, putting the output
// pieces that come before it (ctl.Response.More) in out and errb, or
// dropping them when those are nil. The caller holds s.mu.
//
// An end of ctx interrupts the exchange by moving the connection's
// deadline to now, from the goroutine context.AfterFunc starts. That
// goroutine gets the connection it was set up for, never reads s.conn
// (which a failed exchange clears, under s.mu the goroutine does not
// hold), and is waited for before the connection is closed or used again:
// one that ran late would cut short the next exchange or the detach of
// disconnect.
func (s *Sandbox) exchange(ctx context.Context, req ctl.Request, wait time.Duration, out, errb *ctl.CapBuffer) (ctl.Response, error) {
	select {
	case <-s.exited:
		return ctl.Response{}, ErrDead
	default:
	}
	if s.conn == nil {
		if err := s.dial(ctx); err != nil {
			return ctl.Response{}, err
		}
	}
	c := s.conn
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(interrupted)
		c.SetDeadline(time.Now())
	})
	resp, err := s.converse(c, s.rd, req, out, errb)
	if !stop() {
		<-interrupted
	}
	if err == nil {
		return resp, nil
	}
	s.disconnect()
	var ce *connError
	if !errors.As(err, &ce) {
		return ctl.Response{}, err
	}
	if ctx.Err() != nil {
		return ctl.Response{}, fmt.Errorf("sandbox %s: %w", s.cfg.ID, ctx.Err())
	}
	err = s.connErr(ce.what, ce.err)
	if ctx.Err() != nil {
		// ctx's deadline was the connection's, and the I/O saw it a
		// moment before ctx did.
		return ctl.Response{}, fmt.Errorf("sandbox %s: %w", s.cfg.ID, ctx.Err())
	}
	return ctl.Response{}, err
}

// connError is an I/O failure on the control connection, which exchange
// classifies (connErr) once the connection is released.
type connError struct {
	what string
	err  error
}

func (e *connError) Error() string { return e.what + ": " + e.err.Error() }

// converse writes req to c and reads its answer from rd (c's reader). Any
// error leaves the connection unusable.
func (s *Sandbox) converse(c net.Conn, rd *bufio.Reader, req ctl.Request, out, errb *ctl.CapBuffer) (ctl.Response, error) {
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return ctl.Response{}, &connError{"send request", err}
	}
	var piece []byte
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return ctl.Response{}, &connError{"read response", err}
		}
		var resp ctl.Response
		if err := json.Unmarshal(line, &resp); err != nil {
			return ctl.Response{}, fmt.Errorf("decode sandbox response: %w", err)
		}
		if !resp.More {
			return resp, nil
		}
		dst := out
		switch {
		case resp.Chunk < 0 || resp.Chunk > ctl.MaxChunk:
			return ctl.Response{}, fmt.Errorf("decode sandbox response: output piece of %d bytes", resp.Chunk)
		case resp.Stream == ctl.StreamStderr:
			dst = errb
		case resp.Stream != ctl.StreamStdout:
			return ctl.Response{}, fmt.Errorf("decode sandbox response: output piece of stream %d", resp.Stream)
		}
		if piece == nil {
			piece = make([]byte, ctl.MaxChunk)
		}
		if _, err := io.ReadFull(rd, piece[:resp.Chunk]); err != nil {
			return ctl.Response{}, &connError{"read response", err}
		}
		if dst != nil {
			dst.Write(piece[:resp.Chunk])
		}
	}
}

// result makes the Result of an answer whose output pieces went to out and
// errb. An init that predates streaming sent its (capped) output in the
// answer itself.
func result(resp ctl.Response, out, errb *ctl.CapBuffer) *Result {
	out.Write(resp.Stdout)
	errb.Write(resp.Stderr)
	return &Result{
		Stdout: out.Bytes(), Stderr: errb.Bytes(),
		StdoutBytes: resp.StdoutBytes, StderrBytes: resp.StderrBytes,
		Truncated: resp.Truncated || out.Truncated() || errb.Truncated(),
		ExitCode:  resp.ExitCode, Cwd: resp.Cwd, TimedOut: resp.TimedOut, Duration: resp.Duration,
	}
}

func (s *Sandbox) connErr(what string, err error) error {
	select {
	case <-s.exited:
		return fmt.Errorf("%s: %w", what, ErrDead)
	case <-time.After(50 * time.Millisecond):
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: %w", what, ErrTimeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Exec runs cmd in the persistent shell.
func (s *Sandbox) Exec(ctx context.Context, cmd string, o ExecOptions) (*Result, error) {
	if len(cmd) > ctl.MaxCommand {
		return nil, fmt.Errorf("%w: command is %d bytes, limit %d", ErrBadCommand, len(cmd), ctl.MaxCommand)
	}
	if strings.IndexByte(cmd, 0) >= 0 {
		return nil, fmt.Errorf("%w: command contains a NUL byte", ErrBadCommand)
	}
	if o.Timeout <= 0 {
		o.Timeout = ctl.DefaultTimeout
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	var events []LimitEvent
	if !o.NoLimitCheck {
		events = append(events, s.checkLimits()...)
	}
	// Init needs at most a few seconds beyond the command's own timeout to
	// kill it and bring the shell back.
	max := OutputCap(o.MaxOutput)
	out, errb := ctl.NewCapBuffer(max), ctl.NewCapBuffer(max)
	resp, err := s.exchange(ctx, ctl.Request{Op: ctl.OpExec, Cmd: cmd, Timeout: o.Timeout, MaxOutput: max}, o.Timeout+15*time.Second, out, errb)
	if err != nil {
		return nil, fmt.Errorf("exec in sandbox %s: %w", s.cfg.ID, err)
	}
	if resp.Error != "" {
		// With ShellExited, the command ended the shell and init could
		// not start another: the sandbox cannot run the next command.
		if r, err := s.call(ctx, ctl.Request{Op: ctl.OpShell}, 10*time.Second); err == nil && r.ShellError != "" {
			if berr := s.shellBroken(r.ShellPath, r.ShellError); berr != nil {
				return nil, fmt.Errorf("exec in sandbox %s: %w", s.cfg.ID, berr)
			}
		}
		return nil, fmt.Errorf("exec in sandbox %s: %s", s.cfg.ID, resp.Error)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("exec in sandbox %s: %w", s.cfg.ID, err)
	}
	if !o.NoLimitCheck {
		events = append(events, s.checkLimits()...)
		events = append(events, s.checkDisk(ctx)...)
	}
	if resp.Rejected > 0 {
		s.log.Debug("init dropped forged or stray status records", slog.Int("count", resp.Rejected))
	}
	if resp.ShellExited {
		if r, err := s.call(ctx, ctl.Request{Op: ctl.OpShell}, 10*time.Second); err == nil {
			s.shellPID = r.ShellPID
		}
	}
	r := result(resp, out, errb)
	r.ShellRestarted, r.Limits, r.RejectedStatus = resp.ShellExited, events, resp.Rejected
	return r, nil
}

// Run runs script as `/bin/sh -c` in a fresh child of init, not in the
// persistent shell: its environment is exactly o.Env (plus PATH and HOME
// when absent), its directory o.Dir, its stdin /dev/null, and its stdout
// and stderr go to pipes only init reads. Nothing the agent defined in its
// shell applies to it. ShellRestarted is never set; Cwd is the directory
// it started in.
func (s *Sandbox) Run(ctx context.Context, script string, o RunOptions) (*Result, error) {
	if len(script) > ctl.MaxCommand {
		return nil, fmt.Errorf("%w: script is %d bytes, limit %d", ErrBadCommand, len(script), ctl.MaxCommand)
	}
	if o.Timeout <= 0 {
		o.Timeout = ctl.DefaultTimeout
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	events := s.checkLimits()
	max := OutputCap(o.MaxOutput)
	out, errb := ctl.NewCapBuffer(max), ctl.NewCapBuffer(max)
	resp, err := s.exchange(ctx, ctl.Request{Op: ctl.OpRun, Cmd: script, Timeout: o.Timeout, MaxOutput: max, Env: o.Env, Dir: o.Dir}, o.Timeout+15*time.Second, out, errb)
	if err != nil {
		return nil, fmt.Errorf("run in sandbox %s: %w", s.cfg.ID, err)
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("run in sandbox %s: %s", s.cfg.ID, resp.Error)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("run in sandbox %s: %w", s.cfg.ID, err)
	}
	r := result(resp, out, errb)
	r.Limits = append(events, s.checkLimits()...)
	return r, nil
}

// checkLimits reports limit events since the last check. A sandbox that hit
// its pids limit is assumed to run a fork bomb: every task but init and the
// shell is killed, with the group frozen so nothing forks meanwhile.
func (s *Sandbox) checkLimits() []LimitEvent {
	now := s.cg.counters()
	var ev []LimitEvent
	if now.oomKill > s.seen.oomKill {
		ev = append(ev, LimitEvent{Resource: "memory", Limit: s.cfg.Limits.MemoryBytes,
			Message: fmt.Sprintf("memory limit reached: the OOM killer killed %d process(es)", now.oomKill-s.seen.oomKill)})
	}
	if now.pidsMax > s.seen.pidsMax {
		// The shell may have been replaced meanwhile: ask init which it is.
		if r, err := s.call(context.Background(), ctl.Request{Op: ctl.OpShell}, 10*time.Second); err == nil {
			s.shellPID = r.ShellPID
		}
		n, err := s.killAll(true)
		msg := fmt.Sprintf("process limit reached (%d forks refused): killed %d processes, the shell was kept", now.pidsMax-s.seen.pidsMax, n)
		if err != nil {
			msg += fmt.Sprintf(" (clean-up incomplete: %v)", err)
		}
		ev = append(ev, LimitEvent{Resource: "pids", Limit: s.cfg.Limits.Pids, Message: msg})
		now = s.cg.counters()
	}
	s.seen = now
	for _, e := range ev {
		s.log.Warn("sandbox hit a limit", slog.String("resource", e.Resource), slog.String("detail", e.Message))
	}
	return ev
}

// diskSlack is how little room under its quota makes a root count as full:
// a write refused at the quota leaves less than a block or two (16 KiB on
// btrfs, none on zfs).
const diskSlack = 1 << 20

// checkDisk reports a "disk" event when the root has reached its quota
// since the previous check. It runs after each command only (one meter read,
// about 20 µs on btrfs): a background writer that fills the root between
// commands is reported after the next one.
func (s *Sandbox) checkDisk(ctx context.Context) []LimitEvent {
	if s.cfg.Disk == nil {
		return nil
	}
	free, err := s.cfg.Disk(ctx)
	if err != nil {
		s.log.Warn("read disk quota", slog.Any("err", err))
		return nil
	}
	full, was := free < diskSlack, s.diskFull
	s.diskFull = full
	if !full || was {
		return nil
	}
	e := LimitEvent{Resource: "disk", Limit: s.cfg.Limits.DiskQuota(),
		Message: fmt.Sprintf("disk quota reached (%d bytes left): writes fail with \"Disk quota exceeded\" until files are deleted (files a checkpoint still holds keep counting)", free)}
	s.log.Warn("sandbox hit a limit", slog.String("resource", e.Resource), slog.String("detail", e.Message))
	return []LimitEvent{e}
}

// KillAllButInit kills every process of the sandbox except init, the
// shell included, with the cgroup frozen so that nothing forks meanwhile,
// and waits until init has started a fresh shell. It returns how many
// processes it killed. Evaluate uses it so that nothing the agent left
// running can touch the verifier.
func (s *Sandbox) KillAllButInit(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	// The new shell is told from the killed one by init's restart count,
	// not by its pid: in a restored sandbox the pid allocator starts low
	// again (CRIU gives each restored task its pid with set_tid, which
	// leaves the allocator's cursor behind), so the new shell may well
	// get the killed one's pid, and waiting for another pid then waits
	// until newShellWait runs out.
	before, err := s.call(ctx, ctl.Request{Op: ctl.OpShell}, 10*time.Second)
	if err != nil {
		return 0, fmt.Errorf("ask init for its shell: %w", err)
	}
	n, err := s.killPass(false)
	if err != nil {
		return n, err
	}
	// Init replaces the shell it lost. Wait for the new one, then sweep
	// again, keeping it: a task that was being forked while the group
	// froze is gone too. A start takes init up to 10 s before it gives
	// up on a shell that does not answer (initd setupWait); a start that
	// failed is reported at once (ShellError).
	deadline := time.Now().Add(newShellWait)
	for {
		r, err := s.call(ctx, ctl.Request{Op: ctl.OpShell}, max(time.Until(deadline), time.Second))
		if err != nil {
			if errors.Is(err, ErrTimeout) {
				err = fmt.Errorf("%w (%s)", err, s.describeTasks())
			}
			return n, fmt.Errorf("wait for the new shell: %w", err)
		}
		if r.ShellError != "" {
			// Init keeps trying in the background; this caller needs a
			// shell now.
			err := fmt.Errorf("init could not start one: %s", r.ShellError)
			if berr := s.shellBroken(r.ShellPath, r.ShellError); berr != nil {
				err = fmt.Errorf("init could not start one: %w", berr)
			}
			return n, fmt.Errorf("wait for the new shell: %w", err)
		}
		if r.ShellPID != 0 && r.ShellRestarts > before.ShellRestarts {
			s.shellPID = r.ShellPID
			break
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("wait for the new shell: %w after %v: init still reports the killed shell (%s)", ErrTimeout, newShellWait, s.describeTasks())
		}
		time.Sleep(5 * time.Millisecond)
	}
	m, err := s.killAll(true)
	return n + m, err
}

// newShellWait bounds KillAllButInit's wait for init's new shell.
const newShellWait = 30 * time.Second

// describeTasks lists the sandbox's tasks for an error message: pid in the
// sandbox, command, scheduler state and the kernel function it waits in,
// so that a sandbox that stops answering names where it is stuck.
func (s *Sandbox) describeTasks() string {
	pids, err := s.cg.procs()
	if err != nil {
		return "tasks unknown: " + err.Error()
	}
	var parts []string
	for _, p := range pids {
		ns, _ := nsPID(p)
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", p))
		state := "?"
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil {
			// pid (comm) S ...: the state follows the last ')'.
			if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
				state = string(b[i+2])
			}
		}
		parts = append(parts, fmt.Sprintf("%d %s %s %s", ns, strings.TrimSpace(string(comm)), state, strings.TrimSpace(string(wchan))))
		if len(parts) == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(pids)-8))
			break
		}
	}
	frozen := ""
	if b, err := os.ReadFile(filepath.Join(s.cg.v2, "cgroup.events")); err == nil && bytes.Contains(b, []byte("frozen 1")) {
		frozen = "group frozen; "
	}
	return frozen + "tasks: " + strings.Join(parts, ", ")
}

// killAll kills every process but init and, when keepShell, the shell,
// until no more appear.
func (s *Sandbox) killAll(keepShell bool) (int, error) {
	killed := 0
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n, err := s.killPass(keepShell)
		killed += n
		if err != nil || n == 0 {
			return killed, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return killed, fmt.Errorf("processes kept appearing for 3s")
}

// killPass freezes the group, sends SIGKILL to every live task but init
// (and the shell when keepShell), thaws it and returns how many it hit.
func (s *Sandbox) killPass(keepShell bool) (int, error) {
	if err := s.cg.freeze(true); err != nil {
		return 0, err
	}
	pids, err := s.cg.procs()
	if err != nil {
		s.cg.freeze(false)
		return 0, err
	}
	n := 0
	for _, p := range pids {
		ns, zombie := nsPID(p)
		if ns == 1 || (keepShell && ns == s.shellPID) || ns == 0 || zombie {
			continue
		}
		if syscall.Kill(p, syscall.SIGKILL) == nil {
			n++
		}
	}
	if err := s.cg.freeze(false); err != nil {
		return n, err
	}
	return n, nil
}

// HostPID returns the host pid of the sandbox's process whose pid inside
// the sandbox is pid (to signal it from the host).
func (s *Sandbox) HostPID(pid int) (int, error) {
	pids, err := s.cg.procs()
	if err != nil {
		return 0, err
	}
	for _, p := range pids {
		if ns, _ := nsPID(p); ns == pid {
			return p, nil
		}
	}
	return 0, fmt.Errorf("sandbox %s has no process %d", s.cfg.ID, pid)
}

// nsPID returns the innermost pid of host pid p (0 when unknown) and
// whether p is a zombie (dead, waiting to be reaped: killing it again
// achieves nothing).
func nsPID(p int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
	if err != nil {
		return 0, false
	}
	ns, zombie := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(line, "NSpid:"); ok {
			if fs := strings.Fields(f); len(fs) > 0 {
				ns, _ = strconv.Atoi(fs[len(fs)-1])
			}
		}
		if f, ok := strings.CutPrefix(line, "State:"); ok {
			zombie = strings.HasPrefix(strings.TrimSpace(f), "Z")
		}
	}
	return ns, zombie
}

// Exclusive runs fn while no command runs and the server holds no
// connection into the sandbox: the state a checkpoint needs. fn may use
// Freeze and Thaw.
func (s *Sandbox) Exclusive(fn func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.disconnect()
	return fn()
}

// Freeze stops every process of the sandbox (cgroup v2 freezer), with no
// task left holding a pending SIGTRAP, which CRIU refuses to dump
// (cgroup.freezeNoTrap).
func (s *Sandbox) Freeze() error { return s.cg.freezeNoTrap() }

// Thaw resumes the sandbox after Freeze.
func (s *Sandbox) Thaw() error { return s.cg.freeze(false) }

// FreezerCgroup is the v2 cgroup directory of the sandbox, which CRIU can
// use to freeze the tree (--freeze-cgroup).
func (s *Sandbox) FreezerCgroup() string { return s.cg.v2 }

// Restore makes a Sandbox of a process tree that restore brings back (a
// CRIU restore whose root is cfg.Root). The cgroups are made first; restore
// must call join with the pid of the tree's root task before that task
// forks, so the whole tree lands in them, and return the host pid of the
// restored init, which must be a child of this process.
//
// expect is the record taken when the tree was dumped (Isolation,
// ReadIsolationRecord). It must satisfy cfg.Isolation, the policy of the
// server now (its Caps are ignored: the record says what the sandbox
// keeps), and what the restore brings back must equal it, init and shell;
// otherwise the child is destroyed and the error wraps ErrIsolation.
func Restore(ctx context.Context, cfg Config, expect IsolationRecord, restore func(join func(pid int) error) (int, error)) (sb *Sandbox, err error) {
	if !idPattern.MatchString(cfg.ID) {
		return nil, fmt.Errorf("sandbox id %q: want 1-64 letters, digits, - or _", cfg.ID)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	cfg.UserNS = cfg.UserNS.WithDefaults() // user namespace mode: userns_linux.go
	if err := expect.CheckPolicy(cfg.Isolation); err != nil {
		return nil, fmt.Errorf("restore: the dumped sandbox: %w", err)
	}
	cg, err := newCgroup("arbor/"+cfg.ID, cfg.Limits, expect.Hardened)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{cfg: cfg, cg: cg, ch: -1, exited: make(chan struct{}), log: cfg.Logger.With(slog.String("sandbox", cfg.ID)),
		iso: IsolationRecord{Hardened: expect.Hardened, Caps: expect.Caps}}
	var joined int // the root task, once placed
	defer func() {
		if err != nil {
			if derr := s.Destroy(context.Background()); derr != nil {
				s.log.Warn("clean up failed restore", slog.Any("err", derr))
			}
			if s.pid == 0 && joined > 0 {
				// A restore that failed after placing the root task (a
				// child of this process, RstSibling) leaves it to us:
				// Destroy killed it, reap it.
				reapWithin(joined, 10*time.Second)
			}
		}
	}()
	pid, err := restore(func(pid int) error {
		joined = pid
		return cg.add(pid)
	})
	if err != nil {
		close(s.exited)
		return nil, err
	}
	s.pid = pid
	go func() {
		st, err := reap(pid) // reap_linux.go: no OS thread per sandbox
		s.log.Debug("restored init exited", slog.Int("status", int(st)), slog.Any("err", err))
		close(s.exited)
	}()
	if err := checkUIDMap(pid, cfg.UserNS); err != nil { // userns_linux.go
		return nil, fmt.Errorf("restored sandbox: %w", err)
	}
	s.seen = cg.counters()
	if err := s.takeChannel(); err != nil {
		return nil, fmt.Errorf("restored sandbox: %w", err)
	}
	resp, err := s.call(ctx, ctl.Request{Op: ctl.OpShell}, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("restored sandbox does not answer: %w", err)
	}
	s.shellPID = resp.ShellPID
	if expect.ShellPID != 0 {
		// Compare the shell the dump saw (the same pid after a restore).
		s.shellPID = expect.ShellPID
	}
	got, err := s.readIsolation()
	s.shellPID = resp.ShellPID
	if err != nil {
		return nil, fmt.Errorf("restored sandbox: %w", err)
	}
	if err := expect.Matches(got); err != nil {
		return nil, err
	}
	return s, nil
}

// reapWithin waits, at most d, for pid to exit if it is a child of this
// process, and collects it.
func reapWithin(pid int, d time.Duration) {
	done := make(chan struct{})
	go func() {
		reap(pid)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// Destroy kills every process of the sandbox and removes its cgroups. The
// root file system is left to its owner. It is idempotent. It kills first
// and then takes the sandbox's lock: a command (or a dump) running under
// that lock ends with the processes instead of holding Destroy up until
// its own timeout.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.cg.kill()
	if s.pid > 0 {
		syscall.Kill(s.pid, syscall.SIGKILL)
	}
	s.mu.Lock()
	s.closed = true
	s.disconnect()
	if s.ch >= 0 {
		unix.Close(s.ch)
		s.ch = -1
	}
	s.mu.Unlock()
	// What the sandbox held goes after its processes, whether or not
	// init is seen to exit in time: they were all sent SIGKILL.
	defer s.closeHeld()
	select {
	case <-s.exited:
	case <-ctx.Done():
		return fmt.Errorf("destroy sandbox %s: %w", s.cfg.ID, ctx.Err())
	case <-time.After(10 * time.Second):
		return fmt.Errorf("destroy sandbox %s: init did not exit: %w", s.cfg.ID, ErrTimeout)
	}
	if err := s.cg.remove(); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", s.cfg.ID, err)
	}
	return nil
}
