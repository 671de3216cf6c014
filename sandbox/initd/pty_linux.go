package initd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The shell's terminal and how init makes sure nobody else holds it (see
// docs/sandbox.md, "Control channel and grader integrity").
//
// A pty's slave can only be opened once the master has unlocked it
// (TIOCSPTLCK 0: the kernel's pty_open fails with EIO while it is locked,
// TIOCGPTPEER too), and it can only be made exclusive (TIOCEXCL, which sets
// the flag on the tty the descriptor belongs to: on the master's it does
// nothing for the slave) through a descriptor of the slave itself. So there
// is always a moment in which the slave is open to every process that can
// reach /dev/pts/N: without CAP_SYS_ADMIN init has no way around it (no
// mount to hide the node, no fanotify permission event to veto an open).
// A process of the sandbox that opens it then keeps a descriptor of the
// new shell's terminal, which TIOCEXCL does not revoke.
//
// Init therefore watches the slave with inotify (IN_OPEN) from before the
// unlock. Its own open (TIOCGPTPEER) is one open; any other one is an open
// by someone else, who then holds the terminal: init throws that pty away
// (closing the master hangs up the slave for whoever holds it) and makes a
// new one. inotify folds an event into the previous one when both are the
// same and the first is still unread, so two opens in a row would read as
// one: init watches both the slave's inode and /dev/pts, and every open
// queues one event for each, which alternate. (Only two opens whose
// notifications run at the very same instant can still fold.) The kernel
// queues the events when the open succeeds, before the opener gets its
// descriptor, so init counts twice: right after TIOCEXCL, before the shell
// starts, and once more after the shell has answered its set-up line,
// before anything else is typed, which also catches an opener that was
// preempted between the tty's checks and its event for as long as the
// shell took to start. (One preempted there for longer still gets in
// unseen: the kernel offers no later moment at which every such open must
// have shown.) The watch ends with start, so that no inotify descriptor is
// left for CRIU to dump.

// ptyTries is how many ptys start makes before it gives up when every one
// is opened by another process before it is exclusive.
const ptyTries = 8

// errPtyTaken: another process opened the slave before it was exclusive.
var errPtyTaken = errors.New("another process opened the terminal before it was exclusive")

// ptyHoldEnv names a directory (inside the sandbox) for a test-only pause
// in openPty: when DIR/hold exists, openPty removes it, writes the pty's
// number to DIR/pts after the unlock and waits (at most 20 s) for DIR/go
// before it makes the slave exclusive, so that a test can open the slave
// in the window. Only a test sets it in the server's environment; stage
// one passes it on to stage two, and the shell never sees it.
const ptyHoldEnv = "ARBOR_TEST_PTY_HOLD"

// pty is a fresh pty pair: the master, the slave (exclusive), its number,
// and the inotify descriptor that counts opens of the slave.
type pty struct {
	master, slave, n int
	watch            int
	wdPts, wdDir     int  // the watches of /dev/pts/N and /dev/pts
	ptsOpens         int  // IN_OPEN events of the slave's watch read so far
	dirOpens         int  // and of the directory's, for N
	overflow         bool // the queue overflowed: opens unknown
}

// openPty makes a pty whose slave init has opened and made exclusive. It
// returns errPtyTaken (with everything closed) when another process opened
// the slave in between.
func openPty() (*pty, error) {
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open ptmx: %w", err)
	}
	p := &pty{master: master, slave: -1, watch: -1}
	fail := func(err error) (*pty, error) {
		p.close()
		return nil, err
	}
	if p.n, err = unix.IoctlGetInt(master, unix.TIOCGPTN); err != nil {
		return fail(fmt.Errorf("pty number: %w", err))
	}
	if p.watch, err = unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK); err != nil {
		return fail(fmt.Errorf("inotify: %w", err))
	}
	// The slave exists (locked) since the open of ptmx.
	if p.wdPts, err = unix.InotifyAddWatch(p.watch, "/dev/pts/"+strconv.Itoa(p.n), unix.IN_OPEN); err != nil {
		return fail(fmt.Errorf("watch pty slave: %w", err))
	}
	if p.wdDir, err = unix.InotifyAddWatch(p.watch, "/dev/pts", unix.IN_OPEN|unix.IN_ONLYDIR); err != nil {
		return fail(fmt.Errorf("watch /dev/pts: %w", err))
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlock pty: %w", err))
	}
	testHold(p.n)
	// From the master, not by path: nothing in the sandbox can put
	// something else at /dev/pts/N for init to open.
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return fail(fmt.Errorf("open pty slave: %w", errno))
	}
	p.slave = int(fd)
	// Exclusive mode: from here on no process may open this terminal
	// (by /dev/pts/N, /dev/tty or /proc/PID/fd) unless it has
	// CAP_SYS_ADMIN. The shell inherits this descriptor and needs no
	// open of its own.
	if err := unix.IoctlSetInt(p.slave, unix.TIOCEXCL, 0); err != nil {
		return fail(fmt.Errorf("set pty exclusive: %w", err))
	}
	if p.taken() {
		return fail(errPtyTaken)
	}
	return p, nil
}

// taken reads the opens queued so far and reports whether anyone but init
// opened the slave (or whether that cannot be known).
func (p *pty) taken() bool {
	var buf [64 * (unix.SizeofInotifyEvent + unix.NAME_MAX + 1)]byte
	name := strconv.Itoa(p.n)
	for {
		n, err := unix.Read(p.watch, buf[:])
		if n <= 0 || err != nil {
			break
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			body := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				p.overflow = true
			case ev.Mask&unix.IN_OPEN == 0:
			case int(ev.Wd) == p.wdPts:
				p.ptsOpens++
			case int(ev.Wd) == p.wdDir && string(bytes.TrimRight(body, "\x00")) == name:
				p.dirOpens++
			}
		}
	}
	return p.ptsOpens != 1 || p.dirOpens != 1 || p.overflow
}

// endWatch closes the inotify descriptor (see the top of the file).
func (p *pty) endWatch() {
	if p.watch >= 0 {
		unix.Close(p.watch)
		p.watch = -1
	}
}

// close closes everything of p; the master last, which hangs up the slave
// for whoever else holds it.
func (p *pty) close() {
	p.endWatch()
	if p.slave >= 0 {
		unix.Close(p.slave)
		p.slave = -1
	}
	if p.master >= 0 {
		unix.Close(p.master)
		p.master = -1
	}
}

// testHold is the pause of ptyHoldEnv.
func testHold(n int) {
	dir := os.Getenv(ptyHoldEnv)
	if dir == "" || os.Remove(filepath.Join(dir, "hold")) != nil {
		return
	}
	os.WriteFile(filepath.Join(dir, "pts"), []byte(strconv.Itoa(n)), 0o644)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if os.Remove(filepath.Join(dir, "go")) == nil {
			return
		}
	}
}
