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
	reset       prometheus.Histogram
	evaluate    prometheus.Histogram
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
		// Reset and evaluate each restore a state (a task's post-setup
		// state, a fork of the env to grade): under load they, not the
		// step, are what a fleet of agents waits on.
		reset: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "arbor_reset_seconds", Help: "Time to serve a successful reset once admitted (a warm env taken or a state restored).", Buckets: buckets,
		}),
		evaluate: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "arbor_evaluate_seconds", Help: "Time to serve a successful evaluate once admitted (the grader's fork and the verifier).", Buckets: buckets,
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_checkpoints_total", Help: "Checkpoints queued, by kind (none counts turns that needed none).",
		}, []string{"kind"}),
		verified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_verify_total", Help: "Turns checked in verification mode, by result (ok, miss, or error: the check could not run).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.step, m.branch, m.checkpoint, m.restore, m.reset, m.evaluate, m.checkpoints, m.verified,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "arbor_active_envs", Help: "Open envs handed out to clients."}, activeEnvs))
	for _, k := range []string{"none", "fs", "proc", "full"} {
		m.checkpoints.WithLabelValues(k)
	}
	registerEngineMetrics(reg, e.Usage)
	return m
}

// registerEngineMetrics exports the engine's checkpoint totals and its
// disk and memory accounting, read at scrape time: one collector that
// reads engineUsage (Engine.Usage, which measures every watched file
// system and reads the manifest) once per scrape and emits every series
// from it. A failed read exports zeros.
func registerEngineMetrics(reg prometheus.Registerer, engineUsage func() (branch.Usage, error)) {
	c := &usageCollector{usage: engineUsage}
	gauge := func(name, help string, labels prometheus.Labels, f func(branch.Usage) float64) {
		c.metrics = append(c.metrics, usageMetric{prometheus.NewDesc(name, help, nil, labels), prometheus.GaugeValue, f})
	}
	counter := func(name, help string, f func(branch.Usage) float64) {
		c.metrics = append(c.metrics, usageMetric{prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, f})
	}
	for _, k := range []manifest.ArtifactKind{manifest.ArtifactFS, manifest.ArtifactProc} {
		labels := prometheus.Labels{"kind": string(k)}
		gauge("arbor_artifacts", "Ready artifacts in the manifest, by kind (fs snapshots, proc images).",
			labels, func(u branch.Usage) float64 { return float64(u.Manifest.Artifacts[k].Count) })
		gauge("arbor_artifact_bytes", "Bytes of the ready artifacts the manifest accounts, by kind (fs: what each snapshot's turn wrote, where the backend tells).",
			labels, func(u branch.Usage) float64 { return float64(u.Manifest.Artifacts[k].Bytes) })
	}
	counter("arbor_gc_passes_total", "Passes of the engine's background garbage collection.",
		func(u branch.Usage) float64 { return float64(u.GC.Passes) })
	counter("arbor_gc_errors_total", "Garbage collection passes that failed.",
		func(u branch.Usage) float64 { return float64(u.GC.Errors) })
	counter("arbor_gc_deleted_states_total", "States garbage collection deleted.",
		func(u branch.Usage) float64 { return float64(u.GC.States) })
	counter("arbor_gc_deleted_artifacts_total", "Artifacts (snapshots, process images) garbage collection deleted.",
		func(u branch.Usage) float64 { return float64(u.GC.Artifacts) })
	counter("arbor_gc_deleted_bytes_total", "Bytes the manifest accounted for the artifacts garbage collection deleted.",
		func(u branch.Usage) float64 { return float64(u.GC.Bytes) })
	counter("arbor_gc_deleted_envs_total", "Records of closed envs garbage collection deleted once their states were all gone.",
		func(u branch.Usage) float64 { return float64(u.GC.Envs) })
	gauge("arbor_gc_last_pass_seconds", "How long the last garbage collection pass held the GC lock.",
		nil, func(u branch.Usage) float64 { return u.GC.LastPass.Seconds() })
	gauge("arbor_gc_max_pass_seconds", "The longest a garbage collection pass held the GC lock since the server started.",
		nil, func(u branch.Usage) float64 { return u.GC.MaxPass.Seconds() })
	// Disk pressure (docs/engine.md): one series per file system watched
	// when the metrics are registered.
	disk := func(name string, f func(branch.DiskUsage) float64) func(branch.Usage) float64 {
		return func(u branch.Usage) float64 {
			for _, d := range u.Disk {
				if d.Name == name {
					return f(d)
				}
			}
			return 0
		}
	}
	if u, err := engineUsage(); err == nil {
		for _, d := range u.Disk {
			labels := prometheus.Labels{"fs": d.Name}
			gauge("arbor_disk_used_bytes", "Bytes in use on a watched file system (pool, cold image store, hot image tmpfs).",
				labels, disk(d.Name, func(d branch.DiskUsage) float64 { return float64(d.Used) }))
			gauge("arbor_disk_free_bytes", "Bytes still free on a watched file system.",
				labels, disk(d.Name, func(d branch.DiskUsage) float64 { return float64(d.Free) }))
			gauge("arbor_disk_size_bytes", "Size of a watched file system.",
				labels, disk(d.Name, func(d branch.DiskUsage) float64 { return float64(d.Total) }))
			gauge("arbor_disk_pressure", "1 while a watched file system is under pressure (from its high mark until back under its low mark), else 0.",
				labels, disk(d.Name, func(d branch.DiskUsage) float64 {
					if d.Over {
						return 1
					}
					return 0
				}))
		}
	}
	counter("arbor_disk_refused_total", "Resets and branches refused because a disk was over its high mark after eviction (no_space).",
		func(u branch.Usage) float64 { return float64(u.Pressure.Refused) })
	counter("arbor_gc_evicted_states_total", "States garbage collection deleted under disk pressure (retention of closed lineages ignored).",
		func(u branch.Usage) float64 { return float64(u.Pressure.Evicted) })
	counter("arbor_image_shrunk_bytes_total", "Hot process image bytes moved to disk under tmpfs pressure.",
		func(u branch.Usage) float64 { return float64(u.Pressure.Shrunk) })
	counter("arbor_checkpoint_time_seconds_total", "Summed duration of the checkpoints taken.",
		func(u branch.Usage) float64 { return u.Coord.CheckpointTime.Seconds() })
	counter("arbor_checkpoint_exposed_seconds_total", "Part of the checkpoint time operations had to wait for (not hidden behind the policy's thinking).",
		func(u branch.Usage) float64 { return u.Coord.Exposed.Seconds() })
	counter("arbor_shell_deltas_total", "Checkpoints committed with a shell delta on the last process image instead of a CRIU dump.",
		func(u branch.Usage) float64 { return float64(u.Coord.ShellDeltas) })
	counter("arbor_delta_images_total", "Process images stored as deltas of their parent state's image (docs/engine.md, Delta images).",
		func(u branch.Usage) float64 { return float64(u.Coord.DeltaImages) })
	counter("arbor_delta_saved_bytes_total", "Bytes of pages delta images left to their bases instead of writing them again.",
		func(u branch.Usage) float64 { return float64(u.Coord.DeltaSaved) })
	counter("arbor_envs_revived_total", "Envs whose sandbox died (init killed, OOM) and that were restored at their last committed state.",
		func(u branch.Usage) float64 { return float64(u.Coord.Revived) })
	gauge("arbor_image_hot_bytes", "Process images on tmpfs.",
		nil, func(u branch.Usage) float64 { return float64(u.Images.HotBytes) })
	gauge("arbor_image_cold_bytes", "Process images on disk.",
		nil, func(u branch.Usage) float64 { return float64(u.Images.ColdBytes) })
	gauge("arbor_states", "States in the manifest.",
		nil, func(u branch.Usage) float64 { return float64(u.Manifest.States) })
	for _, p := range []string{"low", "high"} {
		gauge("arbor_checkpoint_queue_depth", "Jobs (checkpoints, restores) waiting for a worker of the engine's queue, by priority.",
			prometheus.Labels{"priority": p}, func(u branch.Usage) float64 {
				if p == "high" {
					return float64(u.Queue.High.Queued)
				}
				return float64(u.Queue.Low.Queued)
			})
	}
	gauge("arbor_checkpoint_queue_running", "Jobs the engine's queue is running now.",
		nil, func(u branch.Usage) float64 { return float64(u.Queue.Running) })
	gauge("arbor_warm_copies", "Pre-restored frozen copies kept for branching.",
		nil, func(u branch.Usage) float64 { return float64(u.Warm) })
	gauge("arbor_prepared_copies", "Frozen copies prepare made of states ahead of branches from them, ready or still being restored (bounded by the engine's budget).",
		nil, func(u branch.Usage) float64 { return float64(u.Prepare.Ready + u.Prepare.Queued) })
	reg.MustRegister(c)
}

// usageMetric is one series of the engine's accounting: its description
// and how to read it from a Usage.
type usageMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(branch.Usage) float64
}

// usageCollector emits every usageMetric from one read of usage per
// scrape.
type usageCollector struct {
	usage   func() (branch.Usage, error)
	metrics []usageMetric
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	u, err := c.usage()
	if err != nil {
		u = branch.Usage{}
	}
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(u))
	}
}
