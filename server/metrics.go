package server

import (
	"github.com/arbor-env/arbor/branch"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the server's Prometheus collectors. No label carries an env
// or state id: those are unbounded.
type metrics struct {
	step        *prometheus.HistogramVec
	branch      prometheus.Histogram
	checkpoint  *prometheus.HistogramVec
	restore     prometheus.Histogram
	checkpoints *prometheus.CounterVec
	verified    *prometheus.CounterVec
	requests    *prometheus.CounterVec
	conns       prometheus.Gauge
	inFlight    prometheus.Gauge
	unread      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, activeEnvs func() float64) *metrics {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 16) // 1 ms .. 33 s
	m := &metrics{
		step: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "arbor_step_seconds", Help: "Time to serve a step, by tool (gate, command, queueing the checkpoint).", Buckets: buckets,
		}, []string{"tool"}),
		branch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "arbor_branch_seconds", Help: "Time to serve a branch(n), all children.", Buckets: buckets,
		}),
		checkpoint: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "arbor_checkpoint_seconds", Help: "Checkpoint time: background ones as the engine measured them, forced ones end to end.", Buckets: buckets,
		}, []string{"mode"}),
		restore: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "arbor_restore_seconds", Help: "Time to restore a state into an env (rollback).", Buckets: buckets,
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_checkpoints_total", Help: "Checkpoints queued, by kind (none counts turns that needed none).",
		}, []string{"kind"}),
		verified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_verify_total", Help: "Turns checked in verification mode, by result (ok or miss).",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_requests_total", Help: "Requests answered, by method and result code (ok or an error code).",
		}, []string{"method", "code"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "arbor_connections", Help: "Open websocket connections.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "arbor_requests_in_flight", Help: "Requests being served.",
		}),
		unread: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "arbor_unread_bytes", Help: "Bytes of answers queued for clients and not yet written, all connections (each bounded by max_unread_bytes).",
		}),
	}
	reg.MustRegister(m.step, m.branch, m.checkpoint, m.restore, m.checkpoints, m.verified, m.requests, m.conns, m.inFlight, m.unread,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_active_envs", Help: "Open envs handed out to clients."}, activeEnvs),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, k := range []string{"none", "fs", "proc", "full"} {
		m.checkpoints.WithLabelValues(k)
	}
	return m
}

// registerEngineMetrics exports the coordinator's totals and the engine's
// disk and memory accounting, read at scrape time.
func registerEngineMetrics(reg prometheus.Registerer, e *branch.Engine) {
	usage := func(f func(branch.Usage) float64) func() float64 {
		return func() float64 {
			u, err := e.Usage()
			if err != nil {
				return 0
			}
			return f(u)
		}
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_checkpoint_time_seconds_total",
			Help: "Summed duration of the checkpoints taken."}, usage(func(u branch.Usage) float64 { return u.Coord.CheckpointTime.Seconds() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_checkpoint_exposed_seconds_total",
			Help: "Part of the checkpoint time operations had to wait for (not hidden behind the policy's thinking)."},
			usage(func(u branch.Usage) float64 { return u.Coord.Exposed.Seconds() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_envs_revived_total",
			Help: "Envs whose sandbox died (init killed, OOM) and that were restored at their last committed state."},
			usage(func(u branch.Usage) float64 { return float64(u.Coord.Revived) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_image_hot_bytes", Help: "Process images on tmpfs."},
			usage(func(u branch.Usage) float64 { return float64(u.Images.HotBytes) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_image_cold_bytes", Help: "Process images on disk."},
			usage(func(u branch.Usage) float64 { return float64(u.Images.ColdBytes) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_states", Help: "States in the manifest."},
			usage(func(u branch.Usage) float64 { return float64(u.Manifest.States) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_warm_copies", Help: "Pre-restored frozen copies kept for branching."},
			usage(func(u branch.Usage) float64 { return float64(u.Warm) })),
	)
}
