package admit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-env/arbor/state"
)

// order admits, on a queue of one slot held by the test, the waiters
// named in arrivals (tenant/client) in that order, then frees the slot
// and each granted one in turn, and returns the order they were granted.
func order(t *testing.T, arrivals [][2]string) []string {
	t.Helper()
	q := New(Options{Slots: 1})
	hold, err := q.Admit(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	tickets := make(chan *Ticket, len(arrivals))
	for i, a := range arrivals {
		go func() {
			tk, err := q.Admit(context.Background(), a[0], a[1])
			if err != nil {
				t.Errorf("admit %v: %v", a, err)
				return
			}
			mu.Lock()
			got = append(got, a[0]+"/"+a[1])
			mu.Unlock()
			tickets <- tk
		}()
		waitFor(t, func() bool { return q.Stats().Queued == i+1 })
	}
	hold.Done()
	for range arrivals {
		(<-tickets).Done()
	}
	return got
}

func waitFor(t *testing.T, f func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !f(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not reached in 10 s")
		}
	}
}

func many(tenant, client string, n int) [][2]string {
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{tenant, client}
	}
	return out
}

func TestFairness(t *testing.T) {
	tests := []struct {
		name     string
		arrivals [][2]string
		want     []string
	}{
		{
			name:     "one client in arrival order",
			arrivals: many("", "a", 3),
			want:     []string{"/a", "/a", "/a"},
		},
		{
			name:     "a client of 2 is not starved by one of 6 that came first",
			arrivals: append(many("", "big", 6), many("", "small", 2)...),
			want:     []string{"/big", "/small", "/big", "/small", "/big", "/big", "/big", "/big"},
		},
		{
			name:     "three clients round robin",
			arrivals: append(append(many("", "a", 3), many("", "b", 2)...), many("", "c", 1)...),
			want:     []string{"/a", "/b", "/c", "/a", "/b", "/a"},
		},
		{
			name: "tenants first: many clients of one tenant do not starve another's one",
			arrivals: append(append(append(many("x", "1", 2), many("x", "2", 2)...), many("x", "3", 2)...),
				many("y", "1", 2)...),
			want: []string{"x/1", "y/1", "x/2", "y/1", "x/3", "x/1", "x/2", "x/3"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := order(t, tt.arrivals); !slices.Equal(got, tt.want) {
				t.Errorf("granted in order\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}

// clock is a manual clock for the service times.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// withService is a queue whose recent service time is d.
func withService(t *testing.T, o Options, d time.Duration) (*Queue, *clock) {
	t.Helper()
	q := New(o)
	c := &clock{t: time.Unix(1000, 0)}
	q.now = c.now
	tk, err := q.Admit(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	c.add(d)
	tk.Done()
	if got := q.Stats().Service; got != d {
		t.Fatalf("service time %v, want %v", got, d)
	}
	return q, c
}

// TestBusyAtOnce: with the slot held and the service time known, the
// waiters whose estimated wait fits the bound queue, the next is refused
// busy at once with its estimated wait as the hint.
func TestBusyAtOnce(t *testing.T) {
	q, _ := withService(t, Options{Slots: 1, Wait: 2 * time.Second}, time.Second)
	hold, err := q.Admit(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for i := range 2 { // estimated waits 1 s and 2 s: queued
		go func() { _, err := q.Admit(ctx, "", "a"); errs <- err }()
		waitFor(t, func() bool { return q.Stats().Queued == i+1 })
	}
	_, err = q.Admit(context.Background(), "", "a") // 3 s: busy
	if !errors.Is(err, state.ErrBusy) {
		t.Fatalf("third waiter: %v, want busy", err)
	}
	if h := state.RetryAfter(err); h != 3*time.Second {
		t.Errorf("retry after %v, want 3s (the estimated wait: 2 ahead and itself, 1 s each)", h)
	}
	// Another client's first request is estimated behind one of a's
	// only (round robin): 2 s, queued.
	go func() { _, err := q.Admit(ctx, "", "b"); errs <- err }()
	waitFor(t, func() bool { return q.Stats().Queued == 3 })
	if s := q.Stats(); s.Busy != 1 {
		t.Errorf("busy count %d, want 1", s.Busy)
	}
	cancel()
	for range 3 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: %v", err)
		}
	}
	if s := q.Stats(); s.Queued != 0 {
		t.Errorf("%d still queued after their requests ended", s.Queued)
	}
	hold.Done()
	if tk, err := q.Admit(context.Background(), "", "a"); err != nil {
		t.Errorf("admit on an idle queue: %v", err)
	} else {
		tk.Done()
	}
}

// TestBusyAfterBound: a request that waited its bound is refused busy
// with a hint, whether the bound is the queue's or its context's deadline;
// a cancelled one answers its context's error.
func TestBusyAfterBound(t *testing.T) {
	deadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 20*time.Millisecond)
	}
	tests := []struct {
		name string
		wait time.Duration
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"queue's bound", 20 * time.Millisecond, nil, state.ErrBusy},
		{"deadline under no bound", 0, deadline, state.ErrBusy},
		{"deadline under a longer bound", time.Hour, deadline, state.ErrBusy},
		{"cancelled", time.Hour, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := New(Options{Slots: 1, Wait: tt.wait})
			hold, err := q.Admit(context.Background(), "", "")
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Done()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			_, err = q.Admit(ctx, "", "a")
			if !errors.Is(err, tt.want) {
				t.Fatalf("admit: %v, want %v", err, tt.want)
			}
			if errors.Is(err, state.ErrBusy) && state.RetryAfter(err) <= 0 {
				t.Errorf("busy without a retry hint: %v", err)
			}
			if s := q.Stats(); s.Queued != 0 || s.Running != 1 {
				t.Errorf("stats after: %+v", s)
			}
		})
	}
}

// TestMaxQueued: past MaxQueued waiters a request is refused at once.
func TestMaxQueued(t *testing.T) {
	q := New(Options{Slots: 1, MaxQueued: 2})
	hold, err := q.Admit(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		go q.Admit(ctx, "", fmt.Sprint(i))
		waitFor(t, func() bool { return q.Stats().Queued == i+1 })
	}
	if _, err := q.Admit(ctx, "", "x"); !errors.Is(err, state.ErrBusy) || state.RetryAfter(err) <= 0 {
		t.Errorf("admit past MaxQueued: %v (retry after %v), want busy with a hint", err, state.RetryAfter(err))
	}
	hold.Done()
}

// BenchmarkAdmit is the cost of admission on the path of every reset,
// step, branch and evaluate: a free slot, and a slot handed over through
// the queue between goroutines of 8 clients.
func BenchmarkAdmit(b *testing.B) {
	b.Run("free", func(b *testing.B) {
		q := New(Options{Slots: 4, Wait: time.Second})
		ctx := context.Background()
		for b.Loop() {
			tk, err := q.Admit(ctx, "", "a")
			if err != nil {
				b.Fatal(err)
			}
			tk.Done()
		}
	})
	b.Run("contended", func(b *testing.B) {
		q := New(Options{Slots: 2})
		ctx := context.Background()
		var n atomic.Int64
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			client := fmt.Sprint(n.Add(1) % 8)
			for pb.Next() {
				tk, err := q.Admit(ctx, "", client)
				if err != nil {
					b.Error(err)
					return
				}
				tk.Done()
			}
		})
	})
}

// TestPauseAfter: a ticket still running after PauseAfter's delay gives
// its slot back, and the next request is served at once; its resume waits
// while the slots are held, is never refused (not even with the queue
// full), and is served before requests that queued earlier; the time it
// held a slot, not its pause, is its service time. A resume before the
// delay keeps the slot throughout. Done ends a ticket once.
func TestPauseAfter(t *testing.T) {
	q := New(Options{Slots: 1, MaxQueued: 1})
	c := &clock{t: time.Unix(1000, 0)}
	q.now = c.now
	quick, err := q.Admit(context.Background(), "t", "q")
	if err != nil {
		t.Fatal(err)
	}
	resume := quick.PauseAfter(time.Hour)
	resume()
	if s := q.Stats(); s.Running != 1 {
		t.Fatalf("running %d after a resume before the delay, want 1", s.Running)
	}
	quick.Done()

	a, err := q.Admit(context.Background(), "t", "a")
	if err != nil {
		t.Fatal(err)
	}
	c.add(time.Second)
	resumeA := a.PauseAfter(time.Millisecond)
	waitFor(t, func() bool { return q.Stats().Running == 0 })
	b, err := q.Admit(context.Background(), "t", "b")
	if err != nil {
		t.Fatalf("admit while the only slot's ticket is paused: %v", err)
	}
	// A request queues behind b and fills the queue; then a resumes.
	queued := make(chan *Ticket, 1)
	go func() {
		tk, err := q.Admit(context.Background(), "t", "c")
		if err != nil {
			t.Errorf("queued request: %v", err)
		}
		queued <- tk
	}()
	waitFor(t, func() bool { return q.Stats().Queued == 1 })
	if _, err := q.Admit(context.Background(), "t", "e"); !errors.Is(err, state.ErrBusy) {
		t.Fatalf("admit with the queue full: %v, want busy", err)
	}
	resumed := make(chan struct{})
	go func() { resumeA(); close(resumed) }()
	time.Sleep(50 * time.Millisecond)
	select {
	case <-resumed:
		t.Fatal("resumed while the slot is held")
	default:
	}
	c.add(3 * time.Second)
	b.Done()
	<-resumed
	if s := q.Stats(); s.Running != 1 || s.Queued != 1 {
		t.Fatalf("after b ended: running %d queued %d, want the resumed ticket running before the queued request", s.Running, s.Queued)
	}
	c.add(time.Second)
	a.Done()
	a.Done()
	tk := <-queued
	if s := q.Stats(); s.Running != 1 || s.Queued != 0 {
		t.Fatalf("after a ended: running %d queued %d, want the queued request running", s.Running, s.Queued)
	}
	// Service times: b held 3 s, a 1 s + 1 s = 2 s (its pause not counted).
	if got, want := q.Stats().Service, average(3*time.Second, 2*time.Second); got != want { // the quick one held 0: no average yet
		t.Errorf("service %v, want %v", got, want)
	}
	tk.Done()
	if s := q.Stats(); s.Running != 0 {
		t.Errorf("running %d after every ticket ended, want 0", s.Running)
	}
}
