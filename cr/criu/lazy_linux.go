package criu

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Lazy restore (docs/engine.md, "Lazy restore"). CRIU restores the tree
// with its private anonymous memory registered with userfaultfd and hands
// those descriptors to a lazy-pages daemon over the unix socket
// "lazy-pages.socket" in the work directory both share. The tree runs
// before its memory is copied: a page is copied in on its first touch,
// and once the restore has finished the daemon copies the rest in the
// background and exits. A page the daemon has not copied when it dies
// would read as zeros, so its failure must end the tree (LazyPages.Done).

// lazyReadyWait bounds the wait for a lazy-pages daemon to listen on its
// socket (it reads the process tree's image first; ~10-25 ms here).
const lazyReadyWait = 30 * time.Second

// lazyStatusFd is the descriptor a lazy-pages daemon reports readiness on
// ("--status-fd 3": its first ExtraFile).
const lazyStatusFd = 3

// LazyPages is the lazy-pages daemon of one lazy restore: it serves the
// restored tree's memory from the images until it has copied all of it.
// The caller keeps the images it was given (and their directory) until
// Done, and calls Close when the tree is destroyed.
type LazyPages struct {
	cmd  *exec.Cmd
	work string // its work directory: socket and logs
	ownW bool   // work was made for it and is removed by Close
	done chan struct{}
	err  error // why it ended, once done is closed; nil: every page served
	once sync.Once
	cerr error
	took time.Duration // from its start until it listened
}

// Startup is how long the daemon took to start listening.
func (l *LazyPages) Startup() time.Duration { return l.took }

// StartLazyPages starts a lazy-pages daemon for a lazy restore
// (RestoreLazily) of the images in dir, in a work directory of its own,
// and returns once it listens on its socket. It may start before the
// restore's root file system is ready (a branch starts it beside the
// clone). Close it when done with it.
func (c *Checkpointer) StartLazyPages(ctx context.Context, dir string) (*LazyPages, error) {
	work, err := os.MkdirTemp("", "arbor-lazy-")
	if err != nil {
		return nil, err
	}
	l, err := c.startLazyPages(ctx, dir, work)
	if err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	l.ownW = true
	return l, nil
}

// startLazyPages starts a lazy-pages daemon on the images in dir, with
// work as its work directory, and returns once it listens on its socket.
// The images it reads (the process tree, then each task's page map and
// pages, opened while the restore runs and kept open) are those of the
// restore, which may read a copy of dir with other ghost images
// (ghostdir_linux.go) but the same page images.
func (c *Checkpointer) startLazyPages(ctx context.Context, dir, work string) (*LazyPages, error) {
	start := time.Now()
	sr, sw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("lazy-pages status pipe: %w", err)
	}
	defer sr.Close()
	cmd := exec.Command(c.path, "lazy-pages", "-D", dir, "-W", work,
		"--status-fd", strconv.Itoa(lazyStatusFd), "-o", "lazy-pages.log", "-v"+strconv.Itoa(int(logLevel())))
	cmd.ExtraFiles = []*os.File{sw}
	// Its own process group: a signal to the server's group (^C) must
	// not end it before the tree it serves.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	sw.Close()
	if err != nil {
		return nil, fmt.Errorf("start criu lazy-pages: %w", err)
	}
	l := &LazyPages{cmd: cmd, work: work, done: make(chan struct{})}
	go func() {
		werr := cmd.Wait()
		if werr != nil {
			l.err = fmt.Errorf("%w: %v%s", ErrLazyPages, werr, logTail(work, "lazy-pages.log"))
		}
		close(l.done)
	}()
	// The daemon writes one byte and closes the pipe once it listens; an
	// EOF without it is a daemon that failed.
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := io.ReadFull(sr, b)
		ready <- err
	}()
	t := time.NewTimer(lazyReadyWait)
	defer t.Stop()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = ErrTimeout
	}
	if err != nil {
		l.Close()
		if l.err != nil {
			return nil, l.err
		}
		return nil, fmt.Errorf("%w: not ready: %w", ErrLazyPages, err)
	}
	l.took = time.Since(start)
	return l, nil
}

// Background lowers the daemon's CPU priority to the lowest (nice 19):
// for once its tree has been handed out, so that copying the pages it
// was not asked for yields the CPU to the restores still running (a
// branch's other children); pages the tree touches are still served
// first, only more slowly while the CPU is busy.
func (l *LazyPages) Background() error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, l.PID(), 19); err != nil {
		return fmt.Errorf("lower the priority of criu lazy-pages (pid %d): %w", l.PID(), err)
	}
	return nil
}

// PID is the daemon's pid.
func (l *LazyPages) PID() int { return l.cmd.Process.Pid }

// Done is closed when the daemon has exited: it served every page (Err
// nil), or it failed or was killed, and the tree it served may have lost
// memory (Err says why): the caller must then end the tree.
func (l *LazyPages) Done() <-chan struct{} { return l.done }

// Err is why the daemon ended: nil while it runs and after it served
// every page, else an error wrapping ErrLazyPages.
func (l *LazyPages) Err() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

// Wait waits until the daemon has copied all the tree's memory (or
// failed), or ctx ends. It gives the daemon back its full priority first
// (Background): someone needs the copy done.
func (l *LazyPages) Wait(ctx context.Context) error {
	select {
	case <-l.done:
		return l.err
	default:
	}
	unix.Setpriority(unix.PRIO_PROCESS, l.PID(), 0) // best effort: it only goes faster
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close kills the daemon if it still runs, waits (bounded) for it to exit
// and removes its work directory. Call it after the tree it served was
// killed. Safe to call more than once.
func (l *LazyPages) Close() error {
	l.once.Do(func() {
		select {
		case <-l.done:
		default:
			l.cmd.Process.Kill()
			select {
			case <-l.done:
			case <-time.After(exitWait):
				l.cerr = fmt.Errorf("criu lazy-pages (pid %d) %w: still running %v after SIGKILL", l.PID(), ErrTimeout, exitWait)
			}
		}
		if l.ownW {
			os.RemoveAll(l.work)
		}
	})
	return l.cerr
}
