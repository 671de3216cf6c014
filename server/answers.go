package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// answerBudget bounds the server's memory for answers, all connections
// together (docs/protocol.md, "Limits"; Options.MaxAnswerBytes): the
// bytes of answers queued or being written (every connection's outbox)
// plus what the requests running may still produce, reserved when each
// starts from the most its action can output. A request that would go
// over waits until answers are written or dropped, at most answerWait,
// and is then refused with too_many_requests (retryable); one runs
// whenever nothing is held, however large.
type answerBudget struct {
	max int64
	// relieve, when set, is called while a request waits for room: it
	// may drop a connection that holds answers it does not read
	// (Server.dropStalled) and says whether it did.
	relieve func() bool

	mu   sync.Mutex
	used int64
	peak int64         // highest used
	room chan struct{} // closed and replaced whenever used goes down
}

// answerWait bounds how long a request waits for room in the budget.
const answerWait = 30 * time.Second

// stallDrop is how long a client must have taken none of its answers for
// its connection to be dropped while another request waits for room in
// the answer budget (Server.dropStalled).
const stallDrop = 2 * time.Second

// dropStalled drops the connection holding the most answers that its
// client has not taken for stallDrop, if that is at least a sixteenth of
// the answer budget: a client that does not read cannot keep the others'
// steps waiting for memory. It says whether it dropped one.
func (s *Server) dropStalled() bool {
	s.mu.Lock()
	var worst *conn
	var worstHeld int64
	for c := range s.conns {
		if held, since := c.ob.stalled(); since >= stallDrop && held > worstHeld {
			worst, worstHeld = c, held
		}
	}
	s.mu.Unlock()
	if worst == nil || worstHeld < s.answers.max/16 {
		return false
	}
	worst.log.Warn("dropped a connection that takes none of its answers while other requests wait for the server's answer memory",
		slog.Int64("held_bytes", worstHeld), slog.Int64("max_answer_bytes", s.answers.max))
	worst.shut(websocket.ClosePolicyViolation, "answers not read while the server's answer memory is full")
	return true
}

func newAnswerBudget(max int64) *answerBudget {
	return &answerBudget{max: max, room: make(chan struct{})}
}

// acquire reserves n bytes, waiting for room (see answerBudget).
func (b *answerBudget) acquire(ctx context.Context, n int64) error {
	if n <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, answerWait)
	defer cancel()
	tick := time.NewTicker(stallDrop / 2)
	defer tick.Stop()
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.max {
			b.used += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			return nil
		}
		used, room := b.used, b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-tick.C:
			if b.relieve != nil {
				b.relieve()
			}
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return state.Errorf(state.ErrBusy, "the server's memory for answers is in use (%d MiB of %d MiB held by answers clients have not read or requests running; this one may need %d MiB): retry later",
					used>>20, b.max>>20, n>>20)
			}
			return ctx.Err()
		}
	}
}

// add counts n more bytes (negative: fewer) without waiting: the frames
// outboxes hold.
func (b *answerBudget) add(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used += n
	b.peak = max(b.peak, b.used)
	if n < 0 {
		close(b.room)
		b.room = make(chan struct{})
	}
}

// held is what the budget counts now.
func (b *answerBudget) held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// AnswerMemory reports the memory of answers (Options.MaxAnswerBytes):
// what is held now (answers queued or being written, and reservations of
// the requests running), the most ever held, and the bound.
func (s *Server) AnswerMemory() (held, peak, bound int64) {
	b := s.answers
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.peak, b.max
}

// actionCost is the most an action's answer can hold: stdout and stderr
// at their cap, what it writes, and room for the rest of the answer.
func actionCost(a protocol.Action) int64 {
	out := int64(coordinator.OutputCap(a.MaxOutput))
	return 2*out + int64(len(a.Content)) + 64<<10
}

// answerCost is what a request's params say its answer can take (0: a
// small answer, never waited for).
func answerCost(p any) int64 {
	switch p := p.(type) {
	case *protocol.StepParams:
		return actionCost(p.Action)
	case *protocol.StepBatchParams:
		var n int64
		for _, it := range p.Items {
			n += actionCost(it.Action)
		}
		return n
	}
	return 0
}
