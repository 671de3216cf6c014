package coordinator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/manifest"
)

// metrics are the coordinator's Prometheus collectors. No label carries
// an env or state id: those are unbounded.
type metrics struct {
	step        *prometheus.HistogramVec
	branch      prometheus.Histogram
	checkpoint  *prometheus.HistogramVec
	restore     prometheus.Histogram
	checkpoints *prometheus.CounterVec
	verified    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, e *branch.Engine, activeEnvs func() float64) *metrics {
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
	}
	reg.MustRegister(m.step, m.branch, m.checkpoint, m.restore, m.checkpoints, m.verified,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_active_envs", Help: "Open envs handed out to clients."}, activeEnvs))
	for _, k := range []string{"none", "fs", "proc", "full"} {
		m.checkpoints.WithLabelValues(k)
	}
	registerEngineMetrics(reg, e)
	return m
}

// registerEngineMetrics exports the engine's checkpoint totals and its
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
	for _, k := range []manifest.ArtifactKind{manifest.ArtifactFS, manifest.ArtifactProc} {
		labels := prometheus.Labels{"kind": string(k)}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_artifacts", Help: "Ready artifacts in the manifest, by kind (fs snapshots, proc images).",
				ConstLabels: labels}, usage(func(u branch.Usage) float64 { return float64(u.Manifest.Artifacts[k].Count) })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_artifact_bytes", Help: "Bytes of the ready artifacts the manifest accounts, by kind (fs: what each snapshot's turn wrote, where the backend tells).",
				ConstLabels: labels}, usage(func(u branch.Usage) float64 { return float64(u.Manifest.Artifacts[k].Bytes) })),
		)
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_gc_passes_total", Help: "Passes of the engine's background garbage collection."},
			usage(func(u branch.Usage) float64 { return float64(u.GC.Passes) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_gc_errors_total", Help: "Garbage collection passes that failed."},
			usage(func(u branch.Usage) float64 { return float64(u.GC.Errors) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_gc_deleted_states_total", Help: "States garbage collection deleted."},
			usage(func(u branch.Usage) float64 { return float64(u.GC.States) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_gc_deleted_artifacts_total", Help: "Artifacts (snapshots, process images) garbage collection deleted."},
			usage(func(u branch.Usage) float64 { return float64(u.GC.Artifacts) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_gc_deleted_bytes_total", Help: "Bytes the manifest accounted for the artifacts garbage collection deleted."},
			usage(func(u branch.Usage) float64 { return float64(u.GC.Bytes) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_gc_last_pass_seconds", Help: "How long the last garbage collection pass held the GC lock."},
			usage(func(u branch.Usage) float64 { return u.GC.LastPass.Seconds() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_gc_max_pass_seconds", Help: "The longest a garbage collection pass held the GC lock since the server started."},
			usage(func(u branch.Usage) float64 { return u.GC.MaxPass.Seconds() })),
	)
	// Disk pressure (docs/engine.md): one series per watched file system.
	disk := func(name string, f func(branch.DiskUsage) float64) func() float64 {
		return usage(func(u branch.Usage) float64 {
			for _, d := range u.Disk {
				if d.Name == name {
					return f(d)
				}
			}
			return 0
		})
	}
	if u, err := e.Usage(); err == nil {
		for _, d := range u.Disk {
			labels := prometheus.Labels{"fs": d.Name}
			reg.MustRegister(
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_disk_used_bytes", Help: "Bytes in use on a watched file system (pool, cold image store, hot image tmpfs).",
					ConstLabels: labels}, disk(d.Name, func(d branch.DiskUsage) float64 { return float64(d.Used) })),
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_disk_free_bytes", Help: "Bytes still free on a watched file system.",
					ConstLabels: labels}, disk(d.Name, func(d branch.DiskUsage) float64 { return float64(d.Free) })),
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_disk_size_bytes", Help: "Size of a watched file system.",
					ConstLabels: labels}, disk(d.Name, func(d branch.DiskUsage) float64 { return float64(d.Total) })),
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_disk_pressure", Help: "1 while a watched file system is under pressure (from its high mark until back under its low mark), else 0.",
					ConstLabels: labels}, disk(d.Name, func(d branch.DiskUsage) float64 {
					if d.Over {
						return 1
					}
					return 0
				})),
			)
		}
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_disk_refused_total", Help: "Resets and branches refused because a disk was over its high mark after eviction (no_space)."},
			usage(func(u branch.Usage) float64 { return float64(u.Pressure.Refused) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_gc_evicted_states_total", Help: "States garbage collection deleted under disk pressure (retention of closed lineages ignored)."},
			usage(func(u branch.Usage) float64 { return float64(u.Pressure.Evicted) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "arbor_image_shrunk_bytes_total", Help: "Hot process image bytes moved to disk under tmpfs pressure."},
			usage(func(u branch.Usage) float64 { return float64(u.Pressure.Shrunk) })),
	)
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
