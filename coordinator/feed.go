package coordinator

import (
	"sync"
	"sync/atomic"
	"time"
)

// Event types of the feed (Subscribe).
const (
	EventReset    = "reset"
	EventTurn     = "turn"
	EventBranch   = "branch"
	EventRollback = "rollback"
	EventPromote  = "promote"
	EventDiscard  = "discard"
	EventClose    = "close"
	// EventEvaluate: an env's state was evaluated (Reward); the env goes
	// on. EventFinish: an env was evaluated (Reward, absent when the
	// evaluation failed) and closed, its episode over.
	EventEvaluate = "evaluate"
	EventFinish   = "finish"
)

// Event is one change to the envs handed out or their lineage, as the
// feed reports it (its JSON is the web view's, package server/ui).
type Event struct {
	Seq  uint64    `json:"seq"`
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	Env  string    `json:"env,omitempty"`
	Task string    `json:"task,omitempty"`
	// State is the env's state after the event (a reset's, a turn's, a
	// rollback's target, a promote's adopted one; a branch's source state).
	State string `json:"state,omitempty"`
	// Parent is the state a turn started from (State itself for a turn
	// that took no checkpoint).
	Parent string `json:"parent,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Turn   int    `json:"turn"`
	// Children are a branch's new envs; Child is a promote's (closed).
	Children []string `json:"children,omitempty"`
	Child    string   `json:"child,omitempty"`
	// Note is a turn's command and outcome.
	Note *TurnNote `json:"note,omitempty"`
	// Reward is an evaluate's or a finish's.
	Reward *float64 `json:"reward,omitempty"`
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
	// ends remembers how envs ended (ends.go), whoever subscribes.
	ends ends
}

// Subscribe starts a subscription to the feed of changes (resets, turns,
// branches, rollbacks, promotes, discards, closes) holding up to buf
// undelivered events (default 256).
func (c *Coordinator) Subscribe(buf int) *Subscription {
	if buf <= 0 {
		buf = 256
	}
	ch := make(chan Event, buf)
	s := &Subscription{C: ch, c: ch, f: &c.feed}
	c.feed.mu.Lock()
	defer c.feed.mu.Unlock()
	if c.feed.closed {
		close(ch)
		return s
	}
	if c.feed.subs == nil {
		c.feed.subs = map[*Subscription]struct{}{}
	}
	c.feed.subs[s] = struct{}{}
	return s
}

// publish stamps ev and hands it to every subscriber that has room.
func (f *feed) publish(ev Event) {
	f.ends.record(ev)
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
