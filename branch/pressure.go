package branch

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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
	// mark waits for eviction before it is refused with ErrNoSpace.
	DefaultPressureWait = 2 * time.Second
)

// pressureSettle is how long the GC waits after an eviction pass before
// it measures again: a deleted snapshot's room comes back once btrfs's
// cleaner has dropped it, after the commit, so measuring at once would
// evict more than needed.
const pressureSettle = 250 * time.Millisecond

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
	// Refused counts resets and branches refused with ErrNoSpace.
	Refused int64
	// Shrunk counts hot image bytes moved to disk under tmpfs pressure.
	Shrunk int64
}

// pressure is the engine's view of its file systems.
type pressure struct {
	mu    sync.Mutex
	disks []DiskUsage // pool, then cold and hot when on other file systems
	stats PressureStats
	// statfs measures a path (unix.Statfs; tests replace it).
	statfs func(name, path string) (used, total, free int64, err error)
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
	type fs struct{ name, path string }
	all := []fs{{DiskPool, e.o.Snap.Path("")}, {DiskCold, e.cacheDir("cold")}, {DiskHot, e.cacheDir("hot")}}
	seen := map[uint64]bool{}
	for _, f := range all {
		var st unix.Stat_t
		if err := unix.Stat(f.path, &st); err == nil {
			if seen[st.Dev] {
				continue
			}
			seen[st.Dev] = true
		}
		e.pr.disks = append(e.pr.disks, DiskUsage{Name: f.name, Path: f.path})
	}
}

func (e *Engine) cacheDir(which string) string { return filepath.Join(e.o.StateDir, "images", which) }

// measure reads every watched file system and moves its eviction state:
// over from the high mark until back under the low mark. A file system
// that cannot be read keeps its last numbers.
func (e *Engine) measure() []DiskUsage {
	e.pr.mu.Lock()
	defer e.pr.mu.Unlock()
	for i := range e.pr.disks {
		d := &e.pr.disks[i]
		used, total, free, err := e.pr.statfs(d.Name, d.Path)
		if err != nil {
			e.log.Warn("measure disk", "fs", d.Name, "path", d.Path, "err", err)
			continue
		}
		d.Used, d.Total, d.Free = used, total, free
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
	if hot, ok := over[DiskHot]; ok {
		if _, coldOver := over[DiskCold]; !coldOver {
			before := e.cache.Stats().HotBytes
			excess := hot.Used - int64(e.o.LowWater*float64(hot.Total))
			after := e.cache.Shrink(before - excess)
			e.pr.mu.Lock()
			e.pr.stats.Shrunk += max(before-after, 0)
			e.pr.mu.Unlock()
			if after <= before-excess {
				delete(over, DiskHot)
			}
		}
	}
	if len(over) == 0 {
		return true, nil
	}
	_, _, _, err := e.gcPass(ctx, true)
	// Commit what this pass and earlier ones deleted, so that it is freed
	// now rather than at the backend's next periodic commit (btrfs: 30 s
	// by default, and its cleaner drops deleted snapshots after that).
	if s, ok := e.o.Snap.(interface{ Sync(context.Context) error }); ok {
		if serr := s.Sync(ctx); serr != nil {
			e.log.Warn("sync pool", "err", serr)
		}
	}
	return true, err
}

// Admit lets a new env (reset, branch) start unless a watched file system
// is at or above the high mark: then it nudges the GC and waits up to
// Options.PressureWait for eviction to bring it under, and refuses with
// ErrNoSpace if it does not. NewEnv and Branch call it; so does a task's
// reset that hands out a ready env of its pool. Steps and checkpoints are
// never refused.
func (e *Engine) Admit(ctx context.Context) error {
	deadline := time.Now().Add(e.o.PressureWait)
	for {
		var full []string
		for _, d := range e.measure() {
			if d.Fraction() >= e.o.HighWater {
				full = append(full, fmt.Sprintf("%s %.0f%% used (%d of %d bytes)", d.Name, 100*d.Fraction(), d.Used, d.Total))
			}
		}
		if len(full) == 0 {
			return nil
		}
		e.nudgeGC()
		if !time.Now().Before(deadline) {
			e.pr.mu.Lock()
			e.pr.stats.Refused++
			e.pr.mu.Unlock()
			return fmt.Errorf("%w: %s, over the high mark of %.0f%% after eviction", ErrNoSpace, strings.Join(full, ", "), 100*e.o.HighWater)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
