package branch

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/state"
)

// The watermarks' defaults (docs/engine.md, "Disk pressure").
const (
	// DefaultHighWater is the share of a watched file system in use above
	// which GC evicts and, if that is not enough, resets and branches are
	// refused.
	DefaultHighWater = 0.90
	// DefaultLowWater is the share eviction brings it back under.
	DefaultLowWater = 0.80
	// DefaultPressureWait is how long a reset or branch above the high
	// mark waits for eviction before it is refused with state.ErrNoSpace.
	DefaultPressureWait = 2 * time.Second
)

// pressureSettle is how long the GC waits after an eviction pass (and
// its settle) before the next pass measures again.
const pressureSettle = 250 * time.Millisecond

// statfsMax bounds how long measure waits for one file system's statfs.
// A FUSE file system whose daemon hangs (zfs-fuse under load) blocks
// statfs in the kernel until the daemon answers; the GC, Admit and Usage
// must not hang with it. Past the bound the file system keeps its last
// numbers and the call goes on in the background, once per file system
// however many measures want it (docs/engine.md, "Disk pressure").
const statfsMax = 10 * time.Second

// settleMax bounds how long an eviction pass waits for the pool to free
// what it deleted (settle) before the GC goes on.
const settleMax = 5 * time.Second

// The watched file systems, by name (Usage().Disk, the metrics' fs label).
const (
	DiskPool = "pool" // the snapshot backend's pool: roots and file snapshots
	DiskCold = "cold" // the process images on disk
	DiskHot  = "hot"  // the tmpfs of the hot process images
)

// DiskUsage is one watched file system as last measured.
type DiskUsage struct {
	Name string
	Path string
	// Used and Total are bytes; Free is what an unprivileged writer may
	// still write (statfs f_bavail), and Total is Used + Free.
	Used, Total, Free int64
	// Over is the eviction state: set at the high mark, cleared at the
	// low mark.
	Over bool
}

// Fraction is the share of Total in use.
func (d DiskUsage) Fraction() float64 {
	if d.Total <= 0 {
		return 0
	}
	return float64(d.Used) / float64(d.Total)
}

// PressureStats count what disk pressure did since Open.
type PressureStats struct {
	// Evicted counts states deleted by passes under pressure whose
	// retention had not ended (or that GC would have deleted anyway).
	Evicted int64
	// Refused counts resets and branches refused with state.ErrNoSpace.
	Refused int64
	// Shrunk counts hot image bytes moved to disk under tmpfs pressure.
	Shrunk int64
	// Stopped counts envs stopped for holding more than their share of
	// a full pool (share.go).
	Stopped int64
}

// pressure is the engine's view of its file systems.
type pressure struct {
	mu    sync.Mutex
	disks []DiskUsage // pool, then cold and hot when on other file systems
	stats PressureStats
	// statfs measures a path (unix.Statfs; tests replace it).
	statfs func(name, path string) (used, total, free int64, err error)
	// statfsGen counts replacements of statfs: a measure that began
	// with an earlier one neither joins nor records its readings.
	statfsGen int
	// statfsMax bounds each statfs (the const; tests shorten it), and
	// flight keeps one statfs per file system in flight.
	statfsMax time.Duration
	flight    singleflight.Group
	// holds is the kind of artifact each watched file system holds
	// ("": both, when the pool and an image store share one).
	holds map[string]manifest.ArtifactKind
	// reserveMu makes reservations one at a time; pending is the quota
	// bytes reserved for envs admitted and not registered yet (share.go).
	reserveMu sync.Mutex
	pending   int64
}

func realStatfs(_, path string) (used, total, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, 0, err
	}
	// The share in use is df's: used / (used + available), used being
	// f_blocks - f_bfree. Blocks neither used nor available (ext4's
	// reserve for root, btrfs's metadata and global reserve) count in
	// neither: a full btrfs pool (89% of f_blocks used, 0 bytes
	// available) reads 100%, and a host disk with a large reserve does
	// not read fuller than df says (size - available read 73% on this
	// VM's disk, which df shows 27% used).
	bs := int64(st.Bsize)
	used, free = int64(st.Blocks-st.Bfree)*bs, int64(st.Bavail)*bs
	return used, used + free, free, nil
}

// initPressure picks the file systems to watch: the pool, and the image
// directories when they are on file systems of their own.
func (e *Engine) initPressure() {
	e.pr.statfs = realStatfs
	e.pr.statfsMax = statfsMax
	type fs struct{ name, path string }
	all := []fs{{DiskPool, e.o.Snap.Path("")}, {DiskCold, e.cacheDir("cold")}, {DiskHot, e.cacheDir("hot")}}
	seen := map[uint64]string{}
	e.pr.holds = map[string]manifest.ArtifactKind{}
	for _, f := range all {
		k := manifest.ArtifactProc
		if f.name == DiskPool {
			k = manifest.ArtifactFS
		}
		var st unix.Stat_t
		if err := unix.Stat(f.path, &st); err == nil {
			if first, ok := seen[st.Dev]; ok {
				if e.pr.holds[first] != k {
					e.pr.holds[first] = "" // both kinds
				}
				continue
			}
			seen[st.Dev] = f.name
		}
		e.pr.disks = append(e.pr.disks, DiskUsage{Name: f.name, Path: f.path})
		e.pr.holds[f.name] = k
	}
}

func (e *Engine) cacheDir(which string) string { return filepath.Join(e.o.StateDir, "images", which) }

// measure reads every watched file system and moves its eviction state:
// over from the high mark until back under the low mark. A file system
// that cannot be read, or does not answer within statfsMax, keeps its
// last numbers.
func (e *Engine) measure() []DiskUsage {
	e.pr.mu.Lock()
	disks, statfs, bound, gen := append([]DiskUsage(nil), e.pr.disks...), e.pr.statfs, e.pr.statfsMax, e.pr.statfsGen
	e.pr.mu.Unlock()
	type reading struct {
		used, total, free int64
		err               error
	}
	got := make([]reading, len(disks))
	for i, d := range disks {
		ch := e.pr.flight.DoChan(d.Name+"/"+strconv.Itoa(gen), func() (any, error) {
			used, total, free, err := statfs(d.Name, d.Path)
			return reading{used, total, free, err}, nil
		})
		t := time.NewTimer(bound)
		select {
		case r := <-ch:
			got[i] = r.Val.(reading)
		case <-t.C:
			got[i].err = fmt.Errorf("statfs gave no answer in %s (the file system hangs)", bound)
		}
		t.Stop()
	}
	e.pr.mu.Lock()
	defer e.pr.mu.Unlock()
	if e.pr.statfsGen != gen {
		return append([]DiskUsage(nil), e.pr.disks...)
	}
	for i, r := range got {
		d := &e.pr.disks[i]
		if r.err != nil {
			e.log.Warn("measure disk", "fs", d.Name, "path", d.Path, "err", r.err)
			continue
		}
		d.Used, d.Total, d.Free = r.used, r.total, r.free
		switch f := d.Fraction(); {
		case f >= e.o.HighWater:
			d.Over = true
		case f <= e.o.LowWater:
			d.Over = false
		}
	}
	return append([]DiskUsage(nil), e.pr.disks...)
}

// relieve is the GC's work under disk pressure, after its normal pass:
// hot images go to disk while the tmpfs is over (and the disk is not),
// and while any file system is over a pass evicts states by the policy
// (manifest.Policy.Evict). It reports whether pressure is on.
func (e *Engine) relieve(ctx context.Context) (bool, error) {
	disks := e.measure()
	over := map[string]DiskUsage{}
	for _, d := range disks {
		if d.Over {
			over[d.Name] = d
		}
	}
	if len(over) == 0 {
		return false, nil
	}
	// Prepared copies are for speed only, and they hold their states and
	// writable clones: they go before any state is evicted.
	e.dropPrepared(ctx)
	excess := func(d DiskUsage) int64 { return d.Used - int64(e.o.LowWater*float64(d.Total)) }
	if hot, ok := over[DiskHot]; ok {
		if _, coldOver := over[DiskCold]; !coldOver {
			before := e.cache.Stats().HotBytes
			after := e.cache.Shrink(before - excess(hot))
			e.pr.mu.Lock()
			e.pr.stats.Shrunk += max(before-after, 0)
			e.pr.mu.Unlock()
			if after <= before-excess(hot) {
				delete(over, DiskHot)
			} else {
				hot.Used -= before - after
				over[DiskHot] = hot
			}
		}
	}
	if len(over) == 0 {
		return true, nil
	}
	// A pass frees no more than takes every file system over its low
	// mark under it, by the bytes the manifest accounts the artifacts
	// (snapshots on the pool, process images on the image stores); the
	// next pass, after settle, measures again and takes what is left.
	ev := &eviction{bytes: map[manifest.ArtifactKind]int64{}}
	for name, d := range over {
		k := e.pr.holds[name]
		ev.bytes[k] = max(ev.bytes[k], excess(d), 1)
	}
	_, _, _, err := e.gcPass(ctx, ev)
	e.settle(ctx)
	// Still over after eviction: live envs hold the pool. The one that
	// holds the most of it is stopped if that is more than its share.
	for _, d := range e.measure() {
		if d.Name == DiskPool && d.Over && d.Fraction() >= e.o.HighWater {
			e.stopOverShare(ctx, d)
		}
	}
	return true, err
}

// settle waits, at most settleMax, until what this pass and earlier ones
// deleted from the pool is freed, so that the next measure sees it and
// eviction stops once the room is back rather than while the backend
// still frees it: btrfs commits only every 30 s by default and its
// cleaner drops deleted snapshots after the commit, a snapshot at a time
// (btrfs.Snapshotter.Settle waits for the cleaner; a backend that cannot
// wait is only committed, Sync).
func (e *Engine) settle(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, settleMax)
	defer cancel()
	var err error
	switch s := e.o.Snap.(type) {
	case interface{ Settle(context.Context) error }:
		err = s.Settle(ctx)
	case interface{ Sync(context.Context) error }:
		err = s.Sync(ctx)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		e.log.Debug("settle pool: not all freed yet (the cleaner still at work, or a file held in a deleted volume)", "err", err)
	case err != nil:
		e.log.Warn("settle pool", "err", err)
	}
}

// eviction is what a GC pass under disk pressure may free: at most the
// states whose artifacts of each kind sum to bytes[kind].
type eviction struct {
	bytes map[manifest.ArtifactKind]int64
}

// underPressure names the watched file systems under pressure as last
// measured (DiskUsage.Over: from the high mark until back under the low
// one; no statfs here, the GC measures every pass), "" when none is.
func (e *Engine) underPressure() string {
	e.pr.mu.Lock()
	defer e.pr.mu.Unlock()
	var full []string
	for _, d := range e.pr.disks {
		if d.Over {
			full = append(full, fmt.Sprintf("%s %.0f%% used", d.Name, 100*d.Fraction()))
		}
	}
	return strings.Join(full, ", ")
}

// Admit lets a new env (reset, branch) start unless a watched file system
// is at or above the high mark: then it nudges the GC and waits up to
// Options.PressureWait for eviction to bring it under, and refuses with
// state.ErrNoSpace if it does not. NewEnv and Branch call it; so does a task's
// reset that hands out a ready env of its pool. Steps and checkpoints are
// never refused.
func (e *Engine) Admit(ctx context.Context) error {
	release, err := e.admit(ctx, 0)
	release()
	return err
}

// admit is Admit for n new envs: with Options.DiskReserve their quotas
// are reserved too (reserve), until release, which the caller calls once
// they are registered (then they count as open envs) or failed.
func (e *Engine) admit(ctx context.Context, n int) (release func(), err error) {
	deadline := time.Now().Add(e.o.PressureWait)
	for {
		var full []string
		disks := e.measure()
		for _, d := range disks {
			if d.Fraction() >= e.o.HighWater {
				full = append(full, fmt.Sprintf("%s %.0f%% used (%d of %d bytes)", d.Name, 100*d.Fraction(), d.Used, d.Total))
			}
		}
		if len(full) == 0 {
			release, why := e.reserve(ctx, disks[0], n)
			if why == "" {
				return release, nil
			}
			full = append(full, why)
		}
		e.nudgeGC()
		if !time.Now().Before(deadline) {
			e.pr.mu.Lock()
			e.pr.stats.Refused++
			e.pr.mu.Unlock()
			return func() {}, fmt.Errorf("%w: %s, over the high mark of %.0f%% after eviction", state.ErrNoSpace, strings.Join(full, ", "), 100*e.o.HighWater)
		}
		select {
		case <-ctx.Done():
			return func() {}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
