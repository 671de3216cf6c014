package ui

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-env/arbor/coordinator"
)

// Event is one change the coordinator reported, as the feed hands it
// on (its JSON is the page's): numbered, with a turn's note.
type Event struct {
	Seq uint64 `json:"seq"`
	coordinator.Event
	// Note is a turn's command and outcome.
	Note *TurnNote `json:"note,omitempty"`
}

// Subscription is one reader of the feed. C delivers the events in
// order; the feed closes it when the subscription ends: Close, the
// coordinator's Close, or the reader falling behind by more than its
// buffer (Dropped), since a publisher never waits for a reader.
type Subscription struct {
	C       <-chan Event
	c       chan Event
	f       *feed
	dropped atomic.Bool
}

// Close ends the subscription; C is closed.
func (s *Subscription) Close() { s.f.remove(s) }

// Dropped reports whether the feed ended the subscription because its
// reader fell behind: it missed events and must read the whole picture
// again.
func (s *Subscription) Dropped() bool { return s.dropped.Load() }

// feed fans events out to subscribers with bounded buffers. Publishing
// never blocks: a subscriber whose buffer is full is dropped. Its mutex
// is a leaf: nothing else is locked while it is held.
type feed struct {
	mu     sync.Mutex
	seq    uint64
	subs   map[*Subscription]struct{}
	closed bool
}

// subscribe starts a subscription to the feed of changes (resets, turns,
// branches, rollbacks, promotes, discards, closes) holding up to buf
// undelivered events (default 256).
func (f *feed) subscribe(buf int) *Subscription {
	if buf <= 0 {
		buf = 256
	}
	ch := make(chan Event, buf)
	s := &Subscription{C: ch, c: ch, f: f}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		close(ch)
		return s
	}
	if f.subs == nil {
		f.subs = map[*Subscription]struct{}{}
	}
	f.subs[s] = struct{}{}
	return s
}

// publish stamps ev and hands it to every subscriber that has room.
func (f *feed) publish(ev Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.subs) == 0 {
		return
	}
	f.seq++
	ev.Seq = f.seq
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	for s := range f.subs {
		select {
		case s.c <- ev:
		default:
			s.dropped.Store(true)
			delete(f.subs, s)
			close(s.c)
		}
	}
}

func (f *feed) remove(s *Subscription) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; ok {
		delete(f.subs, s)
		close(s.c)
	}
}

// close ends every subscription (the coordinator's Close).
func (f *feed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for s := range f.subs {
		delete(f.subs, s)
		close(s.c)
	}
}
