package queue

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
)

// Priority orders queued jobs: every queued High job runs before any Low one.
type Priority int

const (
	// Low is for background work nobody waits on yet (turn-end checkpoints).
	Low Priority = iota
	// High is for work somebody waits on: restores, branches, rollbacks, and
	// a checkpoint behind the gate.
	High
)

// numPriorities sizes the per-priority arrays; Priority values index them.
const numPriorities = 2

// String names the priority for logs.
func (p Priority) String() string {
	switch p {
	case Low:
		return "low"
	case High:
		return "high"
	}
	return fmt.Sprintf("priority(%d)", int(p))
}

// clamp maps any value outside Low..High onto the nearest of the two, so a
// caller's stray value can never index out of range.
func (p Priority) clamp() Priority {
	if p >= High {
		return High
	}
	return Low
}

type jobState int

const (
	stateQueued jobState = iota
	stateRunning
	stateDone
)

// Queue is a bounded worker pool with two priorities. It is safe for
// concurrent use.
type Queue struct {
	log     *slog.Logger
	workers int

	// ctx is handed to every job; cancel ends it when Close gives up
	// waiting.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	cond    *sync.Cond // signalled when a job is queued or the queue closes
	pending [numPriorities]list.List
	closed  bool
	alive   int           // workers not yet exited
	stopped chan struct{} // closed when the last worker exits
	running int
	stats   [numPriorities]PriorityStats
}

// New starts a queue with the given number of workers (runtime.NumCPU() when
// workers <= 0). A nil log discards. Close stops the workers.
func New(workers int, log *slog.Logger) *Queue {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	q := &Queue{
		log:     log,
		workers: workers,
		ctx:     ctx,
		cancel:  cancel,
		alive:   workers,
		stopped: make(chan struct{}),
	}
	q.cond = sync.NewCond(&q.mu)
	for range workers {
		go q.work()
	}
	return q
}

// Submit queues fn at priority p and returns its job. The name is for logs
// and timings only. After Close the job is returned already failed with
// ErrClosed.
func (q *Queue) Submit(p Priority, name string, fn func(ctx context.Context) error) *Job {
	p = p.clamp()
	j := &Job{q: q, name: name, fn: fn, prio: p, submitPrio: p, done: make(chan struct{})}
	now := time.Now()
	q.mu.Lock()
	j.queued = now
	if fn == nil || q.closed {
		j.err = fmt.Errorf("submit %s: %w", name, ErrClosed)
		if fn == nil {
			j.err = fmt.Errorf("submit %s: %w", name, ErrNilFunc)
		}
		j.state = stateDone
		j.finished = now
		q.stats[p].Cancelled++
		q.mu.Unlock()
		close(j.done)
		return j
	}
	j.elem = q.pending[p].PushBack(j)
	q.cond.Signal()
	q.mu.Unlock()
	return j
}

// Close stops accepting jobs, fails every queued job with ErrClosed and waits
// for the running ones to finish. If ctx ends first, Close cancels the
// context the running jobs were given and returns ctx.Err() without waiting
// further; pass an already-cancelled ctx to cancel running jobs at once.
// Close may be called more than once.
func (q *Queue) Close(ctx context.Context) error {
	var dropped []*Job
	now := time.Now()
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		for p := range q.pending {
			l := &q.pending[p]
			for e := l.Front(); e != nil; e = e.Next() {
				j := e.Value.(*Job)
				j.elem = nil
				j.state = stateDone
				j.err = ErrClosed
				j.finished = now
				q.stats[p].Cancelled++
				dropped = append(dropped, j)
			}
			l.Init()
		}
		q.cond.Broadcast()
	}
	q.mu.Unlock()
	for _, j := range dropped {
		close(j.done)
	}
	if len(dropped) > 0 {
		q.log.LogAttrs(ctx, slog.LevelDebug, "queue closed", slog.Int("dropped", len(dropped)))
	}

	select {
	case <-q.stopped:
		q.cancel()
		return nil
	case <-ctx.Done():
		q.cancel()
		return ctx.Err()
	}
}

// work is one worker: it takes the oldest High job, else the oldest Low one,
// until the queue is closed.
func (q *Queue) work() {
	q.mu.Lock()
	for {
		for !q.closed && q.pending[High].Len() == 0 && q.pending[Low].Len() == 0 {
			q.cond.Wait()
		}
		if q.closed {
			// Close emptied the lists; nothing more will be queued.
			break
		}
		l := &q.pending[High]
		if l.Len() == 0 {
			l = &q.pending[Low]
		}
		j := l.Remove(l.Front()).(*Job)
		j.elem = nil
		j.state = stateRunning
		j.started = time.Now()
		j.startPrio = j.prio
		q.running++
		q.mu.Unlock()

		err := q.run(j)

		q.mu.Lock()
		j.finished = time.Now()
		j.err = err
		j.state = stateDone
		q.running--
		s := &q.stats[j.startPrio]
		s.Completed++
		if err != nil {
			s.Failed++
		}
		if j.raised {
			s.Raised++
		}
		t := j.timingsLocked()
		s.LastWait, s.LastRun = t.Wait(), t.Run()
		s.WaitSum += s.LastWait
		s.RunSum += s.LastRun
		q.mu.Unlock()
		close(j.done)
		if q.log.Enabled(q.ctx, slog.LevelDebug) {
			q.log.LogAttrs(q.ctx, slog.LevelDebug, "job done",
				slog.String("job", j.name),
				slog.String("priority", t.Priority.String()),
				slog.Bool("raised", t.Raised),
				slog.Duration("wait", t.Wait()),
				slog.Duration("run", t.Run()),
				slog.Any("err", err))
		}
		q.mu.Lock()
	}
	q.alive--
	if q.alive == 0 {
		close(q.stopped)
	}
	q.mu.Unlock()
}

// run calls the job's function, turning a panic into the job's error so the
// worker survives it.
func (q *Queue) run(j *Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			q.log.LogAttrs(q.ctx, slog.LevelError, "job panicked",
				slog.String("job", j.name),
				slog.Any("panic", r),
				slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("run %s: %w: %v", j.name, ErrPanic, r)
		}
	}()
	return j.fn(q.ctx)
}

// Stats is a snapshot of the queue's load and of the timings of the jobs it
// finished.
type Stats struct {
	Workers int  // size of the pool
	Running int  // jobs running now
	Closed  bool // Close was called
	// Low and High count jobs by priority: those that ran by their priority
	// when they started, the others by their priority at the time.
	Low, High PriorityStats
}

// PriorityStats counts one priority's jobs and sums their timings.
type PriorityStats struct {
	Queued    int    // waiting for a worker now
	Completed uint64 // ran to the end (with or without an error)
	Failed    uint64 // completed with an error (panics included)
	Cancelled uint64 // never ran: dropped by Close or submitted after it
	Raised    uint64 // completed jobs that had been raised from Low

	WaitSum, RunSum   time.Duration // summed over completed jobs
	LastWait, LastRun time.Duration // of the most recently completed job
}

// Stats returns a snapshot of the queue.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Stats{Workers: q.workers, Running: q.running, Closed: q.closed, Low: q.stats[Low], High: q.stats[High]}
	s.Low.Queued = q.pending[Low].Len()
	s.High.Queued = q.pending[High].Len()
	return s
}

// Job is one unit of work submitted to a Queue.
type Job struct {
	q          *Queue
	name       string
	fn         func(ctx context.Context) error
	submitPrio Priority
	done       chan struct{}

	// Guarded by q.mu.
	state     jobState
	prio      Priority
	startPrio Priority
	raised    bool
	elem      *list.Element // position in q.pending while queued
	queued    time.Time
	started   time.Time
	finished  time.Time
	err       error
}

// Name returns the name the job was submitted with.
func (j *Job) Name() string { return j.name }

// Done returns a channel closed when the job has finished (or was dropped).
func (j *Job) Done() <-chan struct{} { return j.done }

// Err returns the job's error once Done is closed, and nil before.
func (j *Job) Err() error {
	j.q.mu.Lock()
	defer j.q.mu.Unlock()
	return j.err
}

// Raise moves a queued Low job to High, behind the High jobs already queued.
// It does nothing to a job that is High, running or finished.
func (j *Job) Raise() {
	q := j.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if j.state != stateQueued || j.prio == High {
		return
	}
	q.pending[Low].Remove(j.elem)
	j.elem = q.pending[High].PushBack(j)
	j.prio = High
	j.raised = true
}

// Wait raises the job if it is still queued at Low (somebody now waits on
// it), then blocks until it finishes and returns its error. If ctx ends
// first Wait returns ctx.Err(); the job is not cancelled and stays raised.
func (j *Job) Wait(ctx context.Context) error {
	select {
	case <-j.done:
		return j.Err()
	default:
	}
	j.Raise()
	select {
	case <-j.done:
		return j.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Timings returns the job's timestamps so far.
func (j *Job) Timings() Timings {
	j.q.mu.Lock()
	defer j.q.mu.Unlock()
	return j.timingsLocked()
}

func (j *Job) timingsLocked() Timings {
	p := j.prio
	if j.state != stateQueued && !j.started.IsZero() {
		p = j.startPrio
	}
	return Timings{
		Queued:    j.queued,
		Started:   j.started,
		Finished:  j.finished,
		Submitted: j.submitPrio,
		Priority:  p,
		Raised:    j.raised,
	}
}

// Timings records when a job was queued, started and finished. Started is
// zero for a job that never ran.
type Timings struct {
	Queued, Started, Finished time.Time
	Submitted                 Priority // priority given to Submit
	Priority                  Priority // priority when it started (current one while queued)
	Raised                    bool     // moved from Low to High while queued
}

// Wait is the time the job spent queued (zero if it never started).
func (t Timings) Wait() time.Duration {
	if t.Started.IsZero() {
		return 0
	}
	return t.Started.Sub(t.Queued)
}

// Run is the time the job's function ran (zero until it finished).
func (t Timings) Run() time.Duration {
	if t.Started.IsZero() || t.Finished.IsZero() {
		return 0
	}
	return t.Finished.Sub(t.Started)
}
