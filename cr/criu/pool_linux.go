package criu

import (
	"fmt"
	"os"
	"sync"

	gocriu "github.com/checkpoint-restore/go-criu/v7"
	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/netns"
)

// A spare is a CRIU process started ahead of time in swrk mode, waiting
// for its one request: starting CRIU (its loader, ~25 libraries) is a
// fixed cost of 10-25 ms here that a spare takes off the critical path.
// A restore spare also holds the fresh loopback network namespace its
// restore will use, which it inherited when it started.
type spare struct {
	g     *gocriu.Criu
	netns *os.File // restore spares only
}

func (s *spare) close() {
	s.g.Cleanup()
	if s.netns != nil {
		s.netns.Close()
	}
}

// startMu serialises starting CRIU processes. go-criu's Prepare makes the
// swrk socket pair without close-on-exec and sets it on the client end only
// after the pair exists: a CRIU started at the same moment by another
// goroutine inherits that end, and then closing ours never ends the first
// CRIU (it waits for a request forever, and so does whoever waits for it to
// exit). The window is short; a restore spare also makes its network
// namespace inheritable for the duration of its start.
var startMu sync.Mutex

// prepare starts CRIU in swrk mode for g, in network namespace ns when ns
// is not nil.
func prepare(g *gocriu.Criu, ns *os.File) error {
	startMu.Lock()
	defer startMu.Unlock()
	if ns == nil {
		return g.Prepare()
	}
	// CRIU (our child) also holds the namespace through a descriptor
	// without close-on-exec; it is set again right after the start so
	// that later children do not.
	if _, err := unix.FcntlInt(ns.Fd(), unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("share net namespace with criu: %w", err)
	}
	defer unix.FcntlInt(ns.Fd(), unix.F_SETFD, unix.FD_CLOEXEC)
	return netns.Do(ns, g.Prepare)
}

// spares keeps one ready CRIU for dumps and one for restores, refilled in
// the background after each use.
type spares struct {
	mu      sync.Mutex
	closed  bool
	dump    chan *spare
	restore chan *spare
	wg      sync.WaitGroup
}

func newSpares(n int) *spares {
	return &spares{dump: make(chan *spare, n), restore: make(chan *spare, n)}
}

// startSpare starts CRIU in swrk mode; for a restore it first makes the
// network namespace and lets CRIU inherit it.
func (c *Checkpointer) startSpare(restore bool) (*spare, error) {
	s := &spare{g: gocriu.MakeCriu()}
	s.g.SetCriuPath(c.path)
	if restore {
		ns, err := newLoopbackNetns()
		if err != nil {
			return nil, err
		}
		s.netns = ns
	}
	// A restore's CRIU itself runs in the namespace: a tree in its own
	// user namespace may not setns into it, and inherits it instead
	// (RestoreRequest.UserNS).
	if err := prepare(s.g, s.netns); err != nil {
		if s.netns != nil {
			s.netns.Close()
		}
		return nil, fmt.Errorf("start criu: %w", err)
	}
	return s, nil
}

// startIn starts a CRIU for one dump inside network namespace ns (no spare:
// the namespace is the sandbox's own).
func (c *Checkpointer) startIn(ns *os.File) (*spare, error) {
	s := &spare{g: gocriu.MakeCriu()}
	s.g.SetCriuPath(c.path)
	if err := netns.Do(ns, func() error { return prepare(s.g, nil) }); err != nil {
		return nil, fmt.Errorf("start criu: %w", err)
	}
	return s, nil
}

// take returns a ready CRIU (a spare if there is one, else a new one) and
// starts a replacement in the background.
func (c *Checkpointer) take(restore bool) (*spare, error) {
	ch := c.spares.dump
	if restore {
		ch = c.spares.restore
	}
	var s *spare
	select {
	case s = <-ch:
	default:
	}
	c.refill(restore, ch)
	if s != nil {
		return s, nil
	}
	return c.startSpare(restore)
}

// refill starts a replacement spare in the background. No lock is held
// while a CRIU starts or is waited for: a CRIU that does not exit must not
// stop every other dump and restore.
func (c *Checkpointer) refill(restore bool, ch chan *spare) {
	c.spares.mu.Lock()
	defer c.spares.mu.Unlock()
	if c.spares.closed || cap(ch) == 0 {
		return
	}
	c.spares.wg.Add(1)
	go func() {
		defer c.spares.wg.Done()
		s, err := c.startSpare(restore)
		if err != nil {
			return // the next take starts one itself and reports
		}
		c.spares.mu.Lock()
		kept := false
		if !c.spares.closed {
			select {
			case ch <- s:
				kept = true
			default:
			}
		}
		c.spares.mu.Unlock()
		if !kept {
			s.close()
		}
	}()
}

// Close stops the spare CRIU processes.
func (c *Checkpointer) Close() error {
	c.spares.mu.Lock()
	c.spares.closed = true
	c.spares.mu.Unlock()
	c.spares.wg.Wait()
	for _, ch := range []chan *spare{c.spares.dump, c.spares.restore} {
		for {
			select {
			case s := <-ch:
				s.close()
				continue
			default:
			}
			break
		}
	}
	return nil
}
