package coordinator

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/arbor-env/arbor/state"
)

// Health is the engine's figures a person watching the server wants on
// one page: the same sources /metrics exports (the coordinator's
// counters and Engine.Usage), read directly.
type Health struct {
	// Checkpoints counts checkpoints queued by kind (arbor_checkpoints_total;
	// none counts turns that needed none).
	Checkpoints map[string]float64 `json:"checkpoints"`
	// CheckpointSeconds and ExposedSeconds: arbor_checkpoint_time_seconds_total
	// and arbor_checkpoint_exposed_seconds_total.
	CheckpointSeconds float64 `json:"checkpoint_seconds"`
	ExposedSeconds    float64 `json:"exposed_seconds"`
	// Queue: arbor_checkpoint_queue_depth by priority, _running, and the
	// pool's size.
	QueueLow     int `json:"queue_low"`
	QueueHigh    int `json:"queue_high"`
	QueueRunning int `json:"queue_running"`
	QueueWorkers int `json:"queue_workers"`
	// The process image cache: arbor_image_hot_bytes, arbor_image_cold_bytes
	// and the counts, the hot tier's capacity, hits and misses.
	ImageHotBytes  int64  `json:"image_hot_bytes"`
	ImageColdBytes int64  `json:"image_cold_bytes"`
	ImageHot       int    `json:"image_hot"`
	ImageCold      int    `json:"image_cold"`
	ImageCapacity  int64  `json:"image_capacity"`
	ImageHits      uint64 `json:"image_hits"`
	ImageMisses    uint64 `json:"image_misses"`
	// WarmCopies: arbor_warm_copies.
	WarmCopies int `json:"warm_copies"`
	// PreparedCopies: arbor_prepared_copies (ready or being restored).
	PreparedCopies int `json:"prepared_copies"`
	// Verified counts verification-mode checks by result, ok, miss or
	// error (arbor_verify_total).
	Verified   map[string]float64 `json:"verified"`
	States     int                `json:"states"`
	ActiveEnvs int                `json:"active_envs"`
	Revived    int64              `json:"revived"`
	Disk       []DiskHealth       `json:"disk"`
	// Admission is admission control's queues by class
	// (arbor_admit_queued, _running, _busy_total; admission.go).
	Admission []Admission `json:"admission"`
}

// DiskHealth is one watched file system (arbor_disk_*).
type DiskHealth struct {
	Name  string `json:"name"`
	Used  int64  `json:"used"`
	Total int64  `json:"total"`
	Over  bool   `json:"over"`
}

// Health reads the figures of Health now.
func (c *Coordinator) Health() (Health, error) {
	u, err := c.e.Usage()
	if err != nil {
		return Health{}, err
	}
	h := Health{Checkpoints: map[string]float64{}, Verified: map[string]float64{},
		CheckpointSeconds: u.Coord.CheckpointTime.Seconds(), ExposedSeconds: u.Coord.Exposed.Seconds(),
		QueueLow: u.Queue.Low.Queued, QueueHigh: u.Queue.High.Queued, QueueRunning: u.Queue.Running, QueueWorkers: u.Queue.Workers,
		ImageHotBytes: u.Images.HotBytes, ImageColdBytes: u.Images.ColdBytes, ImageHot: u.Images.HotCount, ImageCold: u.Images.ColdCount,
		ImageCapacity: u.Images.Capacity, ImageHits: u.Images.Hits, ImageMisses: u.Images.Misses,
		WarmCopies: u.Warm, PreparedCopies: u.Prepare.Ready + u.Prepare.Queued, States: u.Manifest.States, Revived: u.Coord.Revived}
	for _, k := range []state.Kind{state.None, state.FS, state.Proc, state.Full} {
		h.Checkpoints[string(k)] = counterValue(c.m.checkpoints, string(k))
	}
	for _, r := range []string{"ok", "miss", "error"} {
		h.Verified[r] = counterValue(c.m.verified, r)
	}
	c.mu.Lock()
	h.ActiveEnvs = len(c.envs)
	c.mu.Unlock()
	for _, d := range u.Disk {
		h.Disk = append(h.Disk, DiskHealth{Name: d.Name, Used: d.Used, Total: d.Total, Over: d.Over})
	}
	h.Admission = c.Admission()
	return h, nil
}

// counterValue reads one series of a counter vector.
func counterValue(v *prometheus.CounterVec, label string) float64 {
	var m dto.Metric
	if err := v.WithLabelValues(label).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// Add adds the figures of o, another node's, to h: a cluster's health is
// the sum of its nodes' (package router). o's file systems are listed
// under "node/name".
func (h *Health) Add(node string, o Health) {
	if h.Checkpoints == nil {
		h.Checkpoints = map[string]float64{}
	}
	if h.Verified == nil {
		h.Verified = map[string]float64{}
	}
	for k, v := range o.Checkpoints {
		h.Checkpoints[k] += v
	}
	for k, v := range o.Verified {
		h.Verified[k] += v
	}
	h.CheckpointSeconds += o.CheckpointSeconds
	h.ExposedSeconds += o.ExposedSeconds
	h.QueueLow += o.QueueLow
	h.QueueHigh += o.QueueHigh
	h.QueueRunning += o.QueueRunning
	h.QueueWorkers += o.QueueWorkers
	h.ImageHotBytes += o.ImageHotBytes
	h.ImageColdBytes += o.ImageColdBytes
	h.ImageHot += o.ImageHot
	h.ImageCold += o.ImageCold
	h.ImageCapacity += o.ImageCapacity
	h.ImageHits += o.ImageHits
	h.ImageMisses += o.ImageMisses
	h.WarmCopies += o.WarmCopies
	h.PreparedCopies += o.PreparedCopies
	h.States += o.States
	h.ActiveEnvs += o.ActiveEnvs
	h.Revived += o.Revived
	for _, d := range o.Disk {
		d.Name = node + "/" + d.Name
		h.Disk = append(h.Disk, d)
	}
	// Queues add up by class; the recent wait and service time are the
	// slowest node's.
	for _, a := range o.Admission {
		i := slices.IndexFunc(h.Admission, func(b Admission) bool { return b.Class == a.Class })
		if i < 0 {
			h.Admission = append(h.Admission, a)
			continue
		}
		b := &h.Admission[i]
		b.Slots, b.Running, b.Queued, b.Busy = b.Slots+a.Slots, b.Running+a.Running, b.Queued+a.Queued, b.Busy+a.Busy
		b.WaitS, b.ServedS = max(b.WaitS, a.WaitS), max(b.ServedS, a.ServedS)
	}
}
