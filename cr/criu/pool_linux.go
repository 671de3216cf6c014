package criu

import (
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/arbor-env/arbor/internal/netns"
)

// A spare is a CRIU process started ahead of time in swrk mode, waiting
// for its one request: starting CRIU (its loader, ~25 libraries) is a
// fixed cost of 10-25 ms here that a spare takes off the critical path.
// A restore spare also holds the fresh loopback network namespace its
// restore will use, which CRIU got as descriptor netnsFd when it started.
type spare struct {
	w     *swrk
	netns *os.File // restore spares only
}

// netnsFd is the restore spare's network namespace in its CRIU.
const netnsFd = swrkFd + 1

// close ends the spare's CRIU, waiting a bounded time (swrk.close).
func (s *spare) close() error {
	err := s.w.close()
	if s.netns != nil {
		s.netns.Close()
	}
	return err
}

// spares keeps one ready CRIU for dumps and one for restores, refilled in
// the background after each use.
type spares struct {
	mu      sync.Mutex // guards closed and the sends to the channels; never held while a CRIU starts or exits
	closed  bool
	dump    chan *spare
	restore chan *spare
	wg      sync.WaitGroup
}

func newSpares(n int) *spares {
	return &spares{dump: make(chan *spare, n), restore: make(chan *spare, n)}
}

// startSpare starts CRIU in swrk mode; for a restore it first makes the
// network namespace and starts CRIU inside it.
func (c *Checkpointer) startSpare(restore bool) (*spare, error) {
	if !restore {
		w, err := startSwrk(c.path)
		if err != nil {
			return nil, fmt.Errorf("start criu: %w", err)
		}
		return &spare{w: w}, nil
	}
	ns, err := netns.NewLoopback()
	if err != nil {
		return nil, err
	}
	// A restore's CRIU itself runs in the namespace: a tree in its own
	// user namespace may not setns into it, and inherits it instead
	// (RestoreRequest.UserNS).
	w, err := c.startIn(ns, ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &spare{w: w, netns: ns}, nil
}

// startIn starts a CRIU inside network namespace ns, handing it extra.
func (c *Checkpointer) startIn(ns *os.File, extra ...*os.File) (*swrk, error) {
	var w *swrk
	err := netns.Do(ns, func() error {
		var err error
		w, err = startSwrk(c.path, extra...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start criu: %w", err)
	}
	return w, nil
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
			c.closeSpare(s)
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
				c.closeSpare(s)
				continue
			default:
			}
			break
		}
	}
	return nil
}

// closeSpare closes s, logging a CRIU that did not exit.
func (c *Checkpointer) closeSpare(s *spare) {
	if err := s.close(); err != nil {
		c.log.Warn("close criu", slog.Any("err", err))
	}
}
