package imgcache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Options configures a Cache.
type Options struct {
	// HotDir holds the images in memory. Open mounts a tmpfs of 2*HotBytes
	// on it unless it is one already or NoMount is set; Close unmounts a
	// tmpfs mounted on it (by this Cache or one before it), after moving
	// its images to ColdDir.
	HotDir string
	// ColdDir holds evicted images on disk.
	ColdDir string
	// HotBytes bounds the bytes of images kept in HotDir (pinned images may
	// push it over until they are released).
	HotBytes int64
	// NoMount uses HotDir as it is, whatever file system it is on (tests,
	// hosts where the caller mounts it).
	NoMount bool
	// Logger receives eviction and load events; nil discards.
	Logger *slog.Logger

	// copyOnly makes moves between the directories copy even when a rename
	// would do, so tests on one file system cover the copy path.
	copyOnly bool
}

// Cache is the set of process images, hot and cold. It is safe for
// concurrent use.
type Cache struct {
	hotDir, coldDir string
	max             int64
	log             *slog.Logger
	copyOnly        bool
	// ownMount: HotDir is a tmpfs mounted for the cache (by Open, or by
	// an earlier run that did not close), which Close takes down.
	ownMount bool

	mu      sync.Mutex
	entries map[string]*entry
	// lru orders the idle hot images (hot, unpinned, no file operation in
	// flight): only those may be evicted.
	lru     *simplelru.LRU[string, *entry]
	victims []*entry // filled by onEvict while mu is held

	hotBytes, coldBytes int64 // hotBytes includes loads in flight, excludes evictions in flight
	hotCount, coldCount int
	hits, misses        uint64
	evictions, failures uint64
}

// entry is one id's state, guarded by Cache.mu.
type entry struct {
	id       string
	size     int64
	pending  bool // made by NewDir, not yet committed
	hot      bool // HotDir/<id> holds it
	cold     bool // ColdDir/<id> holds it
	pins     int
	removing bool
	// busy is non-nil while a file operation on this id runs outside mu
	// (commit, eviction, load, removal); it is closed when that ends, and
	// every other operation on the id waits for it.
	busy chan struct{}
}

// Open opens (or creates) a cache over o.HotDir and o.ColdDir, rebuilding
// its index from what they hold: hot images enter the LRU in the order of
// their directories' mtimes, and leftovers of interrupted writes are
// deleted.
func Open(o Options) (_ *Cache, err error) {
	if o.HotDir == "" || o.ColdDir == "" || o.HotBytes <= 0 {
		return nil, fmt.Errorf("open image cache: need HotDir, ColdDir and HotBytes > 0")
	}
	hot, err := filepath.Abs(o.HotDir)
	if err != nil {
		return nil, fmt.Errorf("open image cache: %w", err)
	}
	cold, err := filepath.Abs(o.ColdDir)
	if err != nil {
		return nil, fmt.Errorf("open image cache: %w", err)
	}
	if hot == cold {
		return nil, fmt.Errorf("open image cache: HotDir and ColdDir are both %s", hot)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cache{
		hotDir:   hot,
		coldDir:  cold,
		max:      o.HotBytes,
		log:      log,
		copyOnly: o.copyOnly,
		entries:  make(map[string]*entry),
	}
	// The LRU is bounded by bytes, not entries: its own size limit is out
	// of reach, and onEvict only ever fires from RemoveOldest in shrink (or
	// from Remove, where it ignores the call).
	c.lru, err = simplelru.NewLRU(math.MaxInt32, c.onEvict)
	if err != nil {
		return nil, fmt.Errorf("open image cache: %w", err)
	}
	for _, d := range []string{hot, cold} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open image cache: %w", err)
		}
	}
	if !o.NoMount {
		if err := c.mountHot(); err != nil {
			return nil, err
		}
	}
	if err := c.scan(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	v := c.shrinkLocked()
	c.mu.Unlock()
	c.evict(v)
	return c, nil
}

// mountHot makes HotDir a tmpfs. Images already in a plain HotDir would be
// hidden by the mount, so they are moved to ColdDir first.
func (c *Cache) mountHot() error {
	ok, err := isTmpfs(c.hotDir)
	if err != nil {
		return fmt.Errorf("open image cache: %w", err)
	}
	if ok {
		// A tmpfs of its own (an earlier run's that was not closed), or
		// just a folder on a tmpfs.
		c.ownMount, err = isMountPoint(c.hotDir)
		if err != nil {
			return fmt.Errorf("open image cache: %w", err)
		}
		return nil
	}
	names, err := os.ReadDir(c.hotDir)
	if err != nil {
		return fmt.Errorf("open image cache: %w", err)
	}
	for _, d := range names {
		src := filepath.Join(c.hotDir, d.Name())
		if checkID(d.Name()) != nil || !d.IsDir() {
			if err := os.RemoveAll(src); err != nil {
				return fmt.Errorf("open image cache: clear %s: %w", src, err)
			}
			continue
		}
		if _, err := os.Stat(c.coldPath(d.Name())); err == nil {
			err = os.RemoveAll(src)
		} else {
			err = moveDir(src, c.coldPath(d.Name()), d.Name(), true, !c.copyOnly)
		}
		if err != nil {
			return fmt.Errorf("open image cache: move %s out of the way of the tmpfs: %w", d.Name(), err)
		}
	}
	if err := mountTmpfs(c.hotDir, 2*c.max); err != nil {
		return fmt.Errorf("open image cache: %w", err)
	}
	c.ownMount = true
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "mounted tmpfs for hot images",
		slog.String("dir", c.hotDir), slog.Int64("size", 2*c.max))
	return nil
}

// Close takes down the tmpfs the cache mounted on HotDir, first moving
// every hot image to ColdDir so that none is lost with it; it leaves a
// HotDir it did not mount as it is. Nothing may use the cache during or
// after Close, and no image may be pinned. When an image cannot be moved
// the tmpfs stays mounted, with it.
func (c *Cache) Close() error {
	if !c.ownMount {
		return nil
	}
	c.evictWhile(func() bool { return true })
	c.mu.Lock()
	left := c.hotCount
	c.mu.Unlock()
	if left > 0 {
		return fmt.Errorf("close image cache: %d images still in %s (pinned, or a move failed): left mounted", left, c.hotDir)
	}
	if err := unmountTmpfs(c.hotDir); err != nil {
		return fmt.Errorf("close image cache: %w", err)
	}
	c.ownMount = false
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "unmounted tmpfs for hot images", slog.String("dir", c.hotDir))
	return nil
}

// found is an image directory seen by scan.
type found struct {
	id    string
	size  int64
	mtime time.Time
}

// scan indexes both directories and deletes what interrupted writes left.
func (c *Cache) scan() error {
	hot, err := c.scanDir(c.hotDir)
	if err != nil {
		return err
	}
	cold, err := c.scanDir(c.coldDir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range cold {
		c.entries[f.id] = &entry{id: f.id, size: f.size, cold: true}
		c.coldBytes += f.size
		c.coldCount++
	}
	slices.SortStableFunc(hot, func(a, b found) int { return a.mtime.Compare(b.mtime) })
	for _, f := range hot {
		e := c.entries[f.id]
		if e == nil {
			e = &entry{id: f.id, size: f.size}
			c.entries[f.id] = e
		}
		e.hot = true
		c.hotBytes += e.size
		c.hotCount++
		c.lru.Add(f.id, e) // oldest first, so the newest ends most recent
	}
	c.log.LogAttrs(context.Background(), slog.LevelDebug, "image cache indexed",
		slog.Int("hot", c.hotCount), slog.Int64("hot_bytes", c.hotBytes),
		slog.Int("cold", c.coldCount), slog.Int64("cold_bytes", c.coldBytes))
	return nil
}

func (c *Cache) scanDir(dir string) ([]found, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", dir, err)
	}
	var out []found
	for _, d := range des {
		name := d.Name()
		path := filepath.Join(dir, name)
		if strings.HasPrefix(name, pendingPrefix) || strings.HasPrefix(name, tmpPrefix) {
			if err := os.RemoveAll(path); err != nil {
				return nil, fmt.Errorf("scan %s: remove leftover: %w", dir, err)
			}
			c.log.LogAttrs(context.Background(), slog.LevelInfo, "removed leftover image dir", slog.String("path", path))
			continue
		}
		if !d.IsDir() || checkID(name) != nil {
			continue // not ours; leave it alone
		}
		info, err := d.Info()
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", dir, err)
		}
		size, err := dirSize(path)
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", dir, err)
		}
		out = append(out, found{id: name, size: size, mtime: info.ModTime()})
	}
	// ReadDir sorts by name; keep ties in mtime deterministic.
	slices.SortStableFunc(out, func(a, b found) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

func (c *Cache) hotPath(id string) string     { return filepath.Join(c.hotDir, id) }
func (c *Cache) coldPath(id string) string    { return filepath.Join(c.coldDir, id) }
func (c *Cache) pendingPath(id string) string { return filepath.Join(c.hotDir, pendingPrefix+id) }

// NewDir makes a fresh empty directory in HotDir for CRIU to dump image id
// into. It is not accounted, nor visible to Get, until Commit; Remove
// discards it (a failed dump).
func (c *Cache) NewDir(id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	c.mu.Lock()
	if _, ok := c.entries[id]; ok {
		c.mu.Unlock()
		return "", fmt.Errorf("new image dir %s: %w", id, ErrExists)
	}
	e := &entry{id: id, pending: true, busy: make(chan struct{})}
	c.entries[id] = e
	c.mu.Unlock()

	path := c.pendingPath(id)
	err := os.RemoveAll(path) // stale, if a Remove failed half-way
	if err == nil {
		err = os.Mkdir(path, 0o700)
	}

	c.mu.Lock()
	ch := e.busy
	e.busy = nil
	if err != nil {
		delete(c.entries, id)
	}
	c.mu.Unlock()
	close(ch)
	if err != nil {
		return "", fmt.Errorf("new image dir %s: %w", id, err)
	}
	return path, nil
}

// Commit accounts the image dumped into NewDir(id): it measures the
// directory, moves it under its id and makes it the most recently used
// image, evicting the least recently used idle ones to ColdDir while the
// hot images exceed HotBytes. It returns the image's size in bytes.
func (c *Cache) Commit(id string) (int64, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	c.mu.Lock()
	e := c.entries[id]
	switch {
	case e == nil:
		c.mu.Unlock()
		return 0, fmt.Errorf("commit image %s: no NewDir: %w", id, ErrNotFound)
	case !e.pending:
		c.mu.Unlock()
		return 0, fmt.Errorf("commit image %s: %w", id, ErrExists)
	case e.busy != nil:
		c.mu.Unlock()
		return 0, fmt.Errorf("commit image %s: %w", id, ErrBusy)
	}
	e.busy = make(chan struct{})
	c.mu.Unlock()

	size, err := dirSize(c.pendingPath(id))
	if err == nil {
		err = os.RemoveAll(c.hotPath(id)) // stale, if a Remove failed half-way
	}
	if err == nil {
		err = os.Rename(c.pendingPath(id), c.hotPath(id))
	}

	c.mu.Lock()
	ch := e.busy
	e.busy = nil
	var v []*entry
	if err == nil {
		e.pending = false
		e.hot = true
		e.size = size
		c.hotBytes += size
		c.hotCount++
		c.idleLocked(e)
		v = c.shrinkLocked()
	}
	c.mu.Unlock()
	close(ch)
	if err != nil {
		return 0, fmt.Errorf("commit image %s: %w", id, err)
	}
	c.evict(v)
	return size, nil
}

// Acquire returns the path of image id in HotDir, loading it back from
// ColdDir first if it was evicted, and pins it there until release is
// called: a pinned image is never evicted or removed. Any number of callers
// may hold the same image at once; they must only read it. release may be
// called more than once. ctx bounds the wait for a load (its own or one
// another caller started).
//
// An image that is a delta of another (cr/imgdelta: a parent link to
// ../<base>) is read by CRIU through its base, so Acquire pins the base
// too, and the base's own, each in HotDir beside it, and release lets go
// of them all.
func (c *Cache) Acquire(ctx context.Context, id string) (path string, release func(), err error) {
	path, release, err = c.acquire(ctx, id)
	if err != nil {
		return "", nil, err
	}
	for at, depth := path, 0; ; depth++ {
		base, err := imgdelta.Base(at)
		if err == nil && base != "" && depth >= imgdelta.MaxChain {
			err = fmt.Errorf("a chain of more than %d delta images", imgdelta.MaxChain)
		}
		if err != nil {
			release()
			return "", nil, fmt.Errorf("acquire image %s: %w", id, err)
		}
		if base == "" {
			return path, release, nil
		}
		bp, brel, err := c.acquire(ctx, base)
		if err != nil {
			release()
			return "", nil, fmt.Errorf("acquire image %s: its base: %w", id, err)
		}
		prev := release
		release = func() { brel(); prev() }
		at = bp
	}
}

// acquire pins image id alone in HotDir (Acquire).
func (c *Cache) acquire(ctx context.Context, id string) (path string, release func(), err error) {
	if err := checkID(id); err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	e, err := c.waitLocked(ctx, id)
	if err != nil {
		c.mu.Unlock()
		return "", nil, fmt.Errorf("acquire image %s: %w", id, err)
	}
	e.pins++
	path = c.hotPath(id)
	if e.hot {
		c.hits++
		c.lru.Remove(id) // pinned: no longer an eviction candidate
		c.mu.Unlock()
		// The mtime orders the LRU when the cache is reopened.
		now := time.Now()
		_ = os.Chtimes(path, time.Time{}, now)
		return path, c.releaser(e), nil
	}

	// Cold: reserve its bytes in HotDir, make room, then copy it back.
	c.misses++
	e.busy = make(chan struct{})
	c.hotBytes += e.size
	c.hotCount++
	v := c.shrinkLocked()
	c.mu.Unlock()
	c.evict(v)

	start := time.Now()
	err = copyDir(c.coldPath(id), path, id, false)

	c.mu.Lock()
	ch := e.busy
	e.busy = nil
	if err != nil {
		e.pins--
		c.hotBytes -= e.size
		c.hotCount--
		v = c.shrinkLocked()
	} else {
		e.hot = true
	}
	c.mu.Unlock()
	close(ch)
	if err != nil {
		c.evict(v)
		return "", nil, fmt.Errorf("acquire image %s: load from disk: %w", id, err)
	}
	c.log.LogAttrs(ctx, slog.LevelDebug, "image loaded",
		slog.String("image", id), slog.Int64("bytes", e.size), slog.Duration("took", time.Since(start)))
	return path, c.releaser(e), nil
}

// Shrink moves idle hot images to ColdDir, least recently used first,
// until the hot ones take at most target bytes (pinned and busy images
// stay), and returns the hot bytes left: disk pressure on the tmpfs
// (docs/engine.md, "Disk pressure"). Later commits keep to HotBytes again.
func (c *Cache) Shrink(target int64) int64 {
	c.evictWhile(func() bool { return c.hotBytes > max(target, 0) })
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hotBytes
}

// evictWhile drops the least recently used hot images from the LRU while
// more (called with c.mu held) says so, then moves the victims to disk
// outside the lock: the one way Close and Shrink empty the tmpfs.
func (c *Cache) evictWhile(more func() bool) {
	c.mu.Lock()
	for more() {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
	v := c.victims
	c.victims = nil
	c.mu.Unlock()
	c.evict(v)
}

// Get returns the hot path of image id like Acquire, without pinning it:
// the path may be evicted at any moment after Get returns. Callers that
// read the image (restores) use Acquire.
func (c *Cache) Get(ctx context.Context, id string) (string, error) {
	path, release, err := c.Acquire(ctx, id)
	if err != nil {
		return "", err
	}
	release()
	return path, nil
}

// releaser returns the func that unpins e once.
func (c *Cache) releaser(e *entry) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			e.pins--
			c.idleLocked(e)
			v := c.shrinkLocked()
			c.mu.Unlock()
			c.evict(v)
		})
	}
}

// Remove deletes image id, hot and cold copies alike, or discards a NewDir
// that was never committed (only its owner should do that: nothing stops
// a dump still writing into it). It fails with ErrBusy while the image is
// pinned.
func (c *Cache) Remove(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	c.mu.Lock()
	for {
		e := c.entries[id]
		if e == nil {
			c.mu.Unlock()
			return fmt.Errorf("remove image %s: %w", id, ErrNotFound)
		}
		if e.busy != nil {
			ch := e.busy
			c.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return fmt.Errorf("remove image %s: %w", id, ctx.Err())
			}
			c.mu.Lock()
			continue
		}
		if pins := e.pins; pins > 0 {
			c.mu.Unlock()
			return fmt.Errorf("remove image %s: %d pins: %w", id, pins, ErrBusy)
		}
		e.removing = true
		e.busy = make(chan struct{})
		c.lru.Remove(id) // onEvict ignores removing entries
		break
	}
	e := c.entries[id]
	c.mu.Unlock()

	var errs []error
	if e.pending {
		errs = append(errs, os.RemoveAll(c.pendingPath(id)))
	}
	if e.hot {
		errs = append(errs, os.RemoveAll(c.hotPath(id)))
	}
	if e.cold {
		errs = append(errs, os.RemoveAll(c.coldPath(id)))
	}

	c.mu.Lock()
	// The index forgets the id even if a deletion failed: a leftover under
	// a real id is indexed again by the next Open and can be removed then.
	delete(c.entries, id)
	if e.hot {
		c.hotBytes -= e.size
		c.hotCount--
	}
	if e.cold {
		c.coldBytes -= e.size
		c.coldCount--
	}
	ch := e.busy
	e.busy = nil
	c.mu.Unlock()
	close(ch)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove image %s: %w", id, err)
	}
	return nil
}

// Has reports whether image id is committed, hot or cold.
func (c *Cache) Has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[id]
	return e != nil && !e.pending && !e.removing
}

// Stats counts the cache's images and events.
type Stats struct {
	HotBytes  int64  // bytes of images in HotDir (loads in flight included)
	HotCount  int    // images in HotDir
	ColdBytes int64  // bytes of images in ColdDir
	ColdCount int    // images in ColdDir (an image may be both hot and cold)
	Capacity  int64  // HotBytes from Options
	Pinned    int    // images acquired and not yet released
	Pending   int    // NewDir directories not yet committed
	Hits      uint64 // acquisitions served from HotDir
	Misses    uint64 // acquisitions that loaded the image back from ColdDir
	Evictions uint64 // images moved out of HotDir
	// EvictFailures counts evictions that failed (the image stayed hot).
	EvictFailures uint64
}

// Stats returns a snapshot of the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{
		HotBytes: c.hotBytes, HotCount: c.hotCount,
		ColdBytes: c.coldBytes, ColdCount: c.coldCount,
		Capacity: c.max,
		Hits:     c.hits, Misses: c.misses,
		Evictions: c.evictions, EvictFailures: c.failures,
	}
	for _, e := range c.entries {
		if e.pins > 0 {
			s.Pinned++
		}
		if e.pending {
			s.Pending++
		}
	}
	return s
}

// waitLocked returns id's committed entry once no file operation is in
// flight on it. mu is held on entry and on return, released while waiting.
func (c *Cache) waitLocked(ctx context.Context, id string) (*entry, error) {
	for {
		e := c.entries[id]
		if e == nil || e.pending || e.removing {
			return nil, ErrNotFound
		}
		if e.busy == nil {
			return e, nil
		}
		ch := e.busy
		c.mu.Unlock()
		select {
		case <-ch:
			c.mu.Lock()
		case <-ctx.Done():
			c.mu.Lock()
			return nil, ctx.Err()
		}
	}
}

// idleLocked makes e an eviction candidate if it is hot, unpinned and has
// no file operation in flight; Add on a present key only refreshes it.
func (c *Cache) idleLocked(e *entry) {
	if e.hot && e.pins == 0 && e.busy == nil && !e.removing {
		c.lru.Add(e.id, e)
	}
}

// shrinkLocked picks least recently used idle images until the hot ones fit
// in HotBytes, and returns them for evict to move once mu is released.
func (c *Cache) shrinkLocked() []*entry {
	for c.hotBytes > c.max {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break // the rest is pinned or busy; release will try again
		}
	}
	v := c.victims
	c.victims = nil
	return v
}

// onEvict is the LRU's eviction callback, called with mu held. It marks the
// image busy and takes its bytes off the hot total at once, so concurrent
// callers do not pick more victims than needed.
func (c *Cache) onEvict(_ string, e *entry) {
	if e.removing || e.pins > 0 || e.busy != nil {
		return // taken out of the LRU by Remove or Acquire, not evicted
	}
	e.busy = make(chan struct{})
	c.hotBytes -= e.size
	c.hotCount--
	c.victims = append(c.victims, e)
}

// evict moves the victims shrinkLocked picked out of HotDir: to ColdDir if
// they have no cold copy yet (images are immutable, so an existing one is
// the same image), else just deleting the hot copy.
func (c *Cache) evict(victims []*entry) {
	for _, e := range victims {
		start := time.Now()
		var err error
		if e.cold {
			err = os.RemoveAll(c.hotPath(e.id))
		} else {
			err = moveDir(c.hotPath(e.id), c.coldPath(e.id), e.id, true, !c.copyOnly)
		}

		c.mu.Lock()
		ch := e.busy
		e.busy = nil
		if err != nil {
			c.failures++
			// Still hot: count it again and let a later shrink retry.
			c.hotBytes += e.size
			c.hotCount++
			c.idleLocked(e)
		} else {
			c.evictions++
			e.hot = false
			if !e.cold {
				e.cold = true
				c.coldBytes += e.size
				c.coldCount++
			}
		}
		c.mu.Unlock()
		close(ch)
		if err != nil {
			c.log.LogAttrs(context.Background(), slog.LevelWarn, "evict image",
				slog.String("image", e.id), slog.Any("err", err))
			continue
		}
		c.log.LogAttrs(context.Background(), slog.LevelDebug, "image evicted",
			slog.String("image", e.id), slog.Int64("bytes", e.size), slog.Duration("took", time.Since(start)))
	}
}
