package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// blocker occupies every worker of q until the returned func is called, so
// tests can queue jobs in a known order before any of them starts.
func blocker(t *testing.T, q *Queue, workers int) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	var started sync.WaitGroup
	started.Add(workers)
	for i := range workers {
		q.Submit(High, fmt.Sprintf("blocker-%d", i), func(context.Context) error {
			started.Done()
			<-gate
			return nil
		})
	}
	started.Wait()
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// recorder appends each job's name as it runs.
type recorder struct {
	mu    sync.Mutex
	order []string
}

func (r *recorder) job(name string) func(context.Context) error {
	return func(context.Context) error {
		r.mu.Lock()
		r.order = append(r.order, name)
		r.mu.Unlock()
		return nil
	}
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

func closeQueue(t *testing.T, q *Queue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

type step struct {
	prio  Priority
	name  string
	raise bool // raise this job right after submitting it
	wait  bool // start a Wait on it (in a goroutine) after all are queued
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		want  []string
	}{
		{
			name:  "fifo low",
			steps: []step{{prio: Low, name: "a"}, {prio: Low, name: "b"}, {prio: Low, name: "c"}},
			want:  []string{"a", "b", "c"},
		},
		{
			name:  "fifo high",
			steps: []step{{prio: High, name: "a"}, {prio: High, name: "b"}, {prio: High, name: "c"}},
			want:  []string{"a", "b", "c"},
		},
		{
			name:  "high before low",
			steps: []step{{prio: Low, name: "l1"}, {prio: High, name: "h1"}, {prio: Low, name: "l2"}, {prio: High, name: "h2"}},
			want:  []string{"h1", "h2", "l1", "l2"},
		},
		{
			name:  "raise jumps low jobs, stays behind high",
			steps: []step{{prio: Low, name: "l1"}, {prio: High, name: "h1"}, {prio: Low, name: "l2"}, {prio: Low, name: "l3", raise: true}},
			want:  []string{"h1", "l3", "l1", "l2"},
		},
		{
			name:  "wait raises a queued low job",
			steps: []step{{prio: Low, name: "l1"}, {prio: Low, name: "l2"}, {prio: High, name: "h1"}, {prio: Low, name: "l3", wait: true}},
			want:  []string{"h1", "l3", "l1", "l2"},
		},
		{
			name:  "raised jobs keep the order they were raised in",
			steps: []step{{prio: Low, name: "l1"}, {prio: Low, name: "l2", raise: true}, {prio: High, name: "h1"}, {prio: Low, name: "l3", raise: true}},
			want:  []string{"l2", "h1", "l3", "l1"},
		},
		{
			name:  "raising a high job changes nothing",
			steps: []step{{prio: High, name: "h1"}, {prio: High, name: "h2", raise: true}, {prio: Low, name: "l1"}},
			want:  []string{"h1", "h2", "l1"},
		},
		{
			name:  "out of range priorities clamp",
			steps: []step{{prio: Priority(-3), name: "neg"}, {prio: Priority(7), name: "big"}},
			want:  []string{"big", "neg"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := New(1, nil)
			defer closeQueue(t, q)
			release := blocker(t, q, 1)
			defer release()

			var rec recorder
			jobs := make([]*Job, len(tt.steps))
			for i, s := range tt.steps {
				jobs[i] = q.Submit(s.prio, s.name, rec.job(s.name))
				if s.raise {
					jobs[i].Raise()
				}
			}
			var waiters sync.WaitGroup
			for i, s := range tt.steps {
				if !s.wait {
					continue
				}
				waiters.Add(1)
				go func() {
					defer waiters.Done()
					if err := jobs[i].Wait(context.Background()); err != nil {
						t.Errorf("Wait %s: %v", s.name, err)
					}
				}()
				// The raise happens before Wait blocks; poll until it shows.
				deadline := time.Now().Add(5 * time.Second)
				for jobs[i].Timings().Priority != High {
					if time.Now().After(deadline) {
						t.Fatalf("Wait did not raise %s", s.name)
					}
					time.Sleep(time.Millisecond)
				}
			}
			release()
			for _, j := range jobs {
				if err := j.Wait(context.Background()); err != nil {
					t.Fatalf("job %s: %v", j.Name(), err)
				}
			}
			waiters.Wait()
			if got := rec.got(); !slices.Equal(got, tt.want) {
				t.Errorf("order = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTimings(t *testing.T) {
	q := New(1, nil)
	defer closeQueue(t, q)
	release := blocker(t, q, 1)

	low := q.Submit(Low, "low", func(context.Context) error {
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	if tm := low.Timings(); tm.Priority != Low || tm.Raised || !tm.Started.IsZero() || tm.Wait() != 0 {
		t.Fatalf("queued timings = %+v", tm)
	}
	low.Raise()
	time.Sleep(2 * time.Millisecond)
	release()
	if err := low.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	tm := low.Timings()
	if tm.Submitted != Low || tm.Priority != High || !tm.Raised {
		t.Errorf("priorities: %+v", tm)
	}
	if tm.Wait() < 2*time.Millisecond || tm.Run() < 5*time.Millisecond {
		t.Errorf("wait %v run %v: too short", tm.Wait(), tm.Run())
	}
	if !(tm.Queued.Before(tm.Started) && tm.Started.Before(tm.Finished)) {
		t.Errorf("timestamps out of order: %+v", tm)
	}

	s := q.Stats()
	if s.High.Completed != 2 || s.High.Raised != 1 || s.Low.Completed != 0 {
		t.Errorf("stats = %+v", s)
	}
	if s.High.LastRun != tm.Run() || s.High.RunSum < tm.Run() {
		t.Errorf("run stats = %+v, job run %v", s.High, tm.Run())
	}
}

func TestErrors(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		fn   func(context.Context) error
		want error
	}{
		{name: "ok", fn: func(context.Context) error { return nil }},
		{name: "error", fn: func(context.Context) error { return fmt.Errorf("dump: %w", errBoom) }, want: errBoom},
		{name: "panic", fn: func(context.Context) error { panic("kaboom") }, want: ErrPanic},
		{name: "panic error", fn: func(context.Context) error { panic(errBoom) }, want: ErrPanic},
		{name: "nil func", fn: nil, want: ErrNilFunc},
	}
	q := New(1, nil)
	defer closeQueue(t, q)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := q.Submit(Low, tt.name, tt.fn)
			err := j.Wait(context.Background())
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Wait = %v, want %v", err, tt.want)
			}
			if got := j.Err(); !errors.Is(got, tt.want) && got != err {
				t.Errorf("Err = %v, Wait = %v", got, err)
			}
		})
	}
	// The single worker survived both panics.
	if err := q.Submit(High, "after", func(context.Context) error { return nil }).Wait(context.Background()); err != nil {
		t.Fatalf("after panics: %v", err)
	}
	// Wait raises a job that has not started, but the worker may take a
	// Low job before Wait gets to it: a failure counts under either
	// priority (reading High only failed once in a make test here: the
	// error job counted as Low).
	if s := q.Stats(); s.High.Failed+s.Low.Failed != 3 {
		t.Errorf("failed = %d + %d, want 3 (error, 2 panics): %+v", s.High.Failed, s.Low.Failed, s)
	}
}

func TestWaitContext(t *testing.T) {
	q := New(1, nil)
	defer closeQueue(t, q)
	release := blocker(t, q, 1)
	ran := make(chan struct{})
	j := q.Submit(Low, "j", func(context.Context) error { close(ran); return nil })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := j.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want deadline exceeded", err)
	}
	if j.Err() != nil {
		t.Fatalf("Err before done = %v", j.Err())
	}
	select {
	case <-j.Done():
		t.Fatal("job done before the worker was free")
	default:
	}
	if tm := j.Timings(); tm.Priority != High || !tm.Raised {
		t.Errorf("abandoned Wait should leave the job raised: %+v", tm)
	}
	release()
	<-ran
	<-j.Done()
	if err := j.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestBoundedConcurrency(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			q := New(workers, nil)
			defer closeQueue(t, q)
			var now, peak atomic.Int64
			jobs := make([]*Job, 0, 200)
			for i := range 200 {
				p := Low
				if i%3 == 0 {
					p = High
				}
				jobs = append(jobs, q.Submit(p, "j", func(context.Context) error {
					n := now.Add(1)
					for {
						m := peak.Load()
						if n <= m || peak.CompareAndSwap(m, n) {
							break
						}
					}
					time.Sleep(50 * time.Microsecond)
					now.Add(-1)
					return nil
				}))
			}
			for _, j := range jobs {
				if err := j.Wait(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if p := peak.Load(); p > int64(workers) {
				t.Errorf("peak concurrency %d > %d workers", p, workers)
			}
			if s := q.Stats(); s.Running != 0 || s.Low.Completed+s.High.Completed != 200 || s.Workers != workers {
				t.Errorf("stats = %+v", s)
			}
		})
	}
}

func TestDefaultWorkers(t *testing.T) {
	q := New(0, nil)
	defer closeQueue(t, q)
	if q.Stats().Workers < 1 {
		t.Fatalf("workers = %d", q.Stats().Workers)
	}
}

func TestClose(t *testing.T) {
	t.Run("drops queued, waits for running", func(t *testing.T) {
		q := New(1, nil)
		release := blocker(t, q, 1)
		var ctxErr atomic.Value
		running := make(chan struct{})
		finish := make(chan struct{})
		// Replace the blocker's slot: release it, then occupy the worker
		// with a job that watches its context.
		r := q.Submit(High, "running", func(ctx context.Context) error {
			close(running)
			<-finish
			if err := ctx.Err(); err != nil {
				ctxErr.Store(err)
			}
			return nil
		})
		release()
		<-running
		queued := []*Job{
			q.Submit(Low, "q1", func(context.Context) error { t.Error("q1 ran"); return nil }),
			q.Submit(High, "q2", func(context.Context) error { t.Error("q2 ran"); return nil }),
		}

		closed := make(chan error, 1)
		go func() { closed <- q.Close(context.Background()) }()
		for _, j := range queued {
			if err := j.Wait(context.Background()); !errors.Is(err, ErrClosed) {
				t.Errorf("queued job %s: %v, want ErrClosed", j.Name(), err)
			}
			if tm := j.Timings(); !tm.Started.IsZero() || tm.Finished.IsZero() {
				t.Errorf("dropped job timings: %+v", tm)
			}
		}
		select {
		case err := <-closed:
			t.Fatalf("Close returned %v while a job was running", err)
		case <-time.After(20 * time.Millisecond):
		}
		close(finish)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := r.Err(); err != nil {
			t.Fatalf("running job: %v", err)
		}
		if v := ctxErr.Load(); v != nil {
			t.Errorf("running job's context was cancelled by a patient Close: %v", v)
		}
		if j := q.Submit(High, "late", func(context.Context) error { return nil }); !errors.Is(j.Wait(context.Background()), ErrClosed) {
			t.Errorf("submit after close: %v", j.Err())
		}
		s := q.Stats()
		if !s.Closed || s.Low.Cancelled+s.High.Cancelled != 3 || s.Low.Queued+s.High.Queued != 0 {
			t.Errorf("stats = %+v", s)
		}
		if err := q.Close(context.Background()); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})

	t.Run("deadline cancels running jobs", func(t *testing.T) {
		q := New(2, nil)
		running := make(chan struct{}, 2)
		jobs := make([]*Job, 2)
		for i := range jobs {
			jobs[i] = q.Submit(Low, "stubborn", func(ctx context.Context) error {
				running <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			})
		}
		<-running
		<-running
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := q.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close = %v, want deadline exceeded", err)
		}
		for _, j := range jobs {
			if err := j.Wait(context.Background()); !errors.Is(err, context.Canceled) {
				t.Errorf("job: %v, want context.Canceled", err)
			}
		}
		if err := q.Close(context.Background()); err != nil {
			t.Errorf("Close after workers stopped: %v", err)
		}
	})
}

// TestRace hammers one queue from many goroutines: submits at both
// priorities, raises, waits with and without deadlines, stats, then a Close
// racing the last submits. Run it with -race.
func TestRace(t *testing.T) {
	q := New(4, nil)
	var ran atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p := Priority(i % 2)
				j := q.Submit(p, "r", func(context.Context) error {
					ran.Add(1)
					if i%50 == 0 {
						panic("sometimes")
					}
					return nil
				})
				switch (g + i) % 4 {
				case 0:
					j.Raise()
				case 1:
					ctx, cancel := context.WithTimeout(context.Background(), time.Microsecond)
					_ = j.Wait(ctx)
					cancel()
				case 2:
					_ = j.Wait(context.Background())
				case 3:
					_ = q.Stats()
					_ = j.Timings()
				}
			}
		}()
	}
	wg.Wait()
	var late sync.WaitGroup
	for range 8 {
		late.Add(1)
		go func() {
			defer late.Done()
			for range 50 {
				j := q.Submit(Low, "late", func(context.Context) error { ran.Add(1); return nil })
				if err := j.Wait(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("late job: %v", err)
				}
			}
		}()
	}
	closeQueue(t, q)
	late.Wait()
	s := q.Stats()
	total := s.Low.Completed + s.High.Completed + s.Low.Cancelled + s.High.Cancelled
	if total != 32*200+8*50 {
		t.Errorf("accounted %d jobs, want %d: %+v", total, 32*200+8*50, s)
	}
	if int64(s.Low.Completed+s.High.Completed) != ran.Load() {
		t.Errorf("completed %d, ran %d", s.Low.Completed+s.High.Completed, ran.Load())
	}
}

// BenchmarkSubmitWait measures the queue's own overhead: submit a no-op job
// and wait for it.
func BenchmarkSubmitWait(b *testing.B) {
	noop := func(context.Context) error { return nil }
	for _, workers := range []int{1, 2, 8} {
		b.Run(fmt.Sprintf("serial/workers=%d", workers), func(b *testing.B) {
			q := New(workers, nil)
			defer q.Close(context.Background())
			ctx := context.Background()
			for b.Loop() {
				if err := q.Submit(High, "noop", noop).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("parallel/workers=%d", workers), func(b *testing.B) {
			q := New(workers, nil)
			defer q.Close(context.Background())
			ctx := context.Background()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := q.Submit(Low, "noop", noop).Wait(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
