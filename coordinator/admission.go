package coordinator

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/coordinator/admit"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/state"
)

// The classes of operation admission control bounds (package admit;
// docs/architecture.md, "Admission control"): each has its own slots and
// queue.
const (
	ClassReset    = "reset"
	ClassStep     = "step"
	ClassBranch   = "branch"
	ClassEvaluate = "evaluate"
)

// Classes lists the classes of admission, in the order views show them.
var Classes = []string{ClassReset, ClassStep, ClassBranch, ClassEvaluate}

// Slots is how many operations of each class run at once; 0 takes the
// default, a multiple of the host's CPUs (step 8, reset and evaluate 2,
// branch 1 per CPU).
type Slots struct {
	Reset, Step, Branch, Evaluate int
}

// of is the slots of class, defaults applied.
func (s Slots) of(class string) int {
	n, per := 0, 0
	switch class {
	case ClassReset:
		n, per = s.Reset, 2
	case ClassStep:
		n, per = s.Step, 8
	case ClassBranch:
		n, per = s.Branch, 1
	case ClassEvaluate:
		n, per = s.Evaluate, 2
	}
	if n > 0 {
		return n
	}
	return max(per*runtime.NumCPU(), 2)
}

// slotHold is how long a step keeps its slot while its command runs;
// past it the slot is given back until the command ends (admit's
// Ticket.PauseAfter). Short commands keep theirs, so a flood of quick
// steps still meets the queue's bounds.
const slotHold = time.Second

// DefaultAdmitWait is Options.AdmitWait's default.
const DefaultAdmitWait = 10 * time.Second

type clientKey struct{}

// WithClient returns ctx naming the client its requests come from (a
// websocket connection, an OpenEnv peer): admission serves the clients of
// a tenant round robin. Requests of a context without one share one
// client.
func WithClient(ctx context.Context, client string) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

func clientOf(ctx context.Context) string {
	c, _ := ctx.Value(clientKey{}).(string)
	return c
}

// admission is the coordinator's queues, one per class.
type admission struct {
	queues map[string]*admit.Queue
	wait   *prometheus.HistogramVec
	busy   *prometheus.CounterVec
}

func newAdmission(o Options, reg prometheus.Registerer) *admission {
	a := &admission{queues: map[string]*admit.Queue{},
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "arbor_admit_wait_seconds", Help: "Time requests waited for admission, by class (reset, step, branch, evaluate); refused ones included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"class"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_admit_busy_total", Help: "Requests refused busy by admission control, by class (their wait would pass the bound).",
		}, []string{"class"}),
	}
	reg.MustRegister(a.wait, a.busy)
	wait := o.AdmitWait
	if wait == 0 {
		wait = DefaultAdmitWait
	}
	for _, class := range Classes {
		// At most one waiter per env for steps, branches and evaluations
		// (an env's operations are ordered before admission), and resets
		// past max_envs could not be served: the queue's hard bound, also
		// without a wait bound.
		q := admit.New(admit.Options{Slots: o.AdmitSlots.of(class), Wait: wait, MaxQueued: o.MaxEnvs})
		a.queues[class] = q
		a.busy.WithLabelValues(class)
		l := prometheus.Labels{"class": class}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_admit_queued", Help: "Requests waiting for admission, by class.", ConstLabels: l},
				func() float64 { return float64(q.Stats().Queued) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_admit_running", Help: "Requests admitted and running, by class.", ConstLabels: l},
				func() float64 { return float64(q.Stats().Running) }))
	}
	return a
}

// admit waits for a slot of class for ctx's request (its tenant, its
// client): the ticket's Done ends it. It answers state.ErrBusy, with a
// retry hint, when the request would wait past its bound.
func (c *Coordinator) admit(ctx context.Context, class string) (*admit.Ticket, error) {
	start := time.Now()
	t, err := c.adm.queues[class].Admit(ctx, tenant.From(ctx).Name, clientOf(ctx))
	c.adm.wait.WithLabelValues(class).Observe(time.Since(start).Seconds())
	if err != nil {
		if errors.Is(err, state.ErrBusy) {
			c.adm.busy.WithLabelValues(class).Inc()
		}
		return nil, err
	}
	return t, nil
}

// Admission is one class's queue as the web view shows it.
type Admission struct {
	Class   string  `json:"class"`
	Slots   int     `json:"slots"`
	Running int     `json:"running"`
	Queued  int     `json:"queued"`
	WaitS   float64 `json:"wait_s"`    // recent wait of the admitted requests
	ServedS float64 `json:"service_s"` // recent time one took once admitted
	Busy    int64   `json:"busy"`      // refused since the server started
}

// Admission reads the queues of admission control, by class.
func (c *Coordinator) Admission() []Admission {
	out := make([]Admission, 0, len(Classes))
	for _, class := range Classes {
		s := c.adm.queues[class].Stats()
		out = append(out, Admission{Class: class, Slots: s.Slots, Running: s.Running, Queued: s.Queued, WaitS: s.Waited.Seconds(),
			ServedS: s.Service.Seconds(), Busy: s.Busy})
	}
	return out
}
