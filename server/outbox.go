package server

import (
	"sync"
	"time"
)

// outbox holds a connection's encoded frames between the goroutine that
// answers a request and the writer, and counts their bytes against the
// connection's budget of unread answers (Options.MaxUnreadBytes; see
// docs/protocol.md, "Limits"). Over budget, the connection reads no more
// requests and starts none of those it read; the frames themselves are
// always queued (an answer is never dropped for lack of room), so the
// bytes held stay under the budget plus the answers of the requests
// already running.
type outbox struct {
	budget int64
	// onHeld, when set, learns every change of held (a metric); onCross
	// learns when held reaches the budget (over) or falls under it again.
	// Both are called with mu held, so that they see changes in order.
	onHeld  func(delta int64)
	onCross func(over bool)

	mu     sync.Mutex
	frames [][]byte
	held   int64 // bytes queued or being written
	peak   int64 // highest held
	// progress is when the client last took a frame, or when frames
	// began to wait while it had taken all (stalled).
	progress time.Time
	closed   bool
	ready    chan struct{} // 1-buffered: a frame is queued
	room     chan struct{} // closed while held is under budget
}

func newOutbox(budget int64, onHeld func(delta int64), onCross func(over bool)) *outbox {
	room := make(chan struct{})
	close(room)
	return &outbox{budget: budget, onHeld: onHeld, onCross: onCross, ready: make(chan struct{}, 1), room: room}
}

// change applies delta to held and opens or closes room as held crosses
// the budget; mu is held.
func (o *outbox) change(delta int64) {
	wasOver := o.held >= o.budget
	o.held += delta
	o.peak = max(o.peak, o.held)
	over := o.held >= o.budget
	if over != wasOver {
		if over {
			o.room = make(chan struct{})
		} else {
			close(o.room)
		}
		if o.onCross != nil {
			o.onCross(over)
		}
	}
	if o.onHeld != nil && delta != 0 {
		o.onHeld(delta)
	}
}

// put queues b for the writer; after close it drops it.
func (o *outbox) put(b []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if o.held == 0 {
		o.progress = time.Now()
	}
	o.frames = append(o.frames, b)
	o.change(int64(len(b)))
	o.signal()
}

// signal wakes the writer; mu is held.
func (o *outbox) signal() {
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// take hands the writer the oldest frame, nil when none is queued. Its
// bytes stay held until the writer calls wrote.
func (o *outbox) take() []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.frames) == 0 {
		return nil
	}
	b := o.frames[0]
	o.frames[0] = nil
	o.frames = o.frames[1:]
	if len(o.frames) > 0 {
		o.signal() // the writer comes back for the next (after a ping, maybe)
	}
	return b
}

// wrote releases the bytes of a frame take handed out.
func (o *outbox) wrote(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.change(-int64(n))
		o.progress = time.Now()
	}
}

// stalled returns the bytes held and how long the client has taken none
// of them (0 when nothing is held).
func (o *outbox) stalled() (held int64, since time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.held == 0 || o.closed {
		return 0, 0
	}
	return o.held, time.Since(o.progress)
}

// close drops every queued frame, releases their bytes and makes room for
// good: the connection is gone.
func (o *outbox) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.frames = nil
	o.change(-o.held)
	o.closed = true
}

// full returns a channel closed once held is under the budget, or nil
// when it is already.
func (o *outbox) full() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.held < o.budget {
		return nil
	}
	return o.room
}

// over runs f with mu held, telling it whether held is at or over the
// budget, so that f's effect cannot cross a change of that.
func (o *outbox) over(f func(over bool)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(o.held >= o.budget)
}

// stats returns the bytes held now and the most ever held.
func (o *outbox) stats() (held, peak int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held, o.peak
}
