package btrfs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/arbor-env/arbor/cr"
	"golang.org/x/sys/unix"
)

var _ cr.Quotaer = (*Snapshotter)(nil)

// sysfsBtrfs is where the kernel shows each mounted btrfs, by fsid.
const sysfsBtrfs = "/sys/fs/btrfs"

// SetQuota caps volume name with a limit on its qgroup under simple quotas
// (squota), which charge each extent to the subvolume that wrote it for as
// long as the extent exists (see cr.Quotaer). The first cap turns simple
// quotas on for the whole pool with BTRFS_IOC_QUOTA_CTL; later calls are
// one BTRFS_IOC_QGROUP_LIMIT (about 12 µs). The kernel drops a subvolume's
// qgroup a commit or two after it drops the subvolume, unless snapshots
// still hold what it wrote; pruneQgroups sweeps those left behind.
//
// Full qgroup accounting is refused, whether asked for or found on the
// pool: it walks the back references of every changed extent, which made
// snapshot, clone and the drop of a destroyed clone 10 to 200 times slower
// with 100 states sharing an image (docs/sandbox.md, "Disk quota").
func (s *Snapshotter) SetQuota(ctx context.Context, name string, bytes int64) error {
	p, err := s.source(name)
	if err == nil {
		err = s.setQuota(ctx, name, p, bytes)
	}
	if err != nil {
		return fmt.Errorf("set quota of %s: %w", name, mapErrno(name, err))
	}
	return nil
}

func (s *Snapshotter) setQuota(ctx context.Context, name, p string, bytes int64) error {
	a := qgroupLimitArgs{flags: qgroupLimitMaxRfer, maxRfer: uint64(bytes)}
	if bytes <= 0 {
		mode, err := s.quotaMode()
		if err != nil {
			return err
		}
		if mode == "" {
			return nil // quotas off: nothing is capped
		}
		a.maxRfer = qgroupLimitClear
	} else if err := s.enableQuota(ctx); err != nil {
		return err
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// Qgroup id 0 is the subvolume the ioctl is called on. Under simple
	// quotas referenced and exclusive are the same number.
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return err
	}
	// Remember where the qgroup is, so that Quota, read after every
	// command, costs two sysfs reads and a statfs.
	if bytes <= 0 {
		s.capped.Delete(name)
		return nil
	}
	info, err := getSubvolInfo(p)
	if err != nil {
		return err
	}
	dir, err := s.qgroupDir()
	if err != nil {
		return err
	}
	s.capped.Store(name, cappedVolume{qgroup: qgroupPath(dir, info.treeid), path: p, limit: bytes})
	return nil
}

// cappedVolume is where SetQuota left a volume's qgroup.
type cappedVolume struct {
	qgroup, path string
	limit        int64
}

// quotaMode reads the pool's qgroup mode from sysfs: "" when quotas are
// off, "squota" for simple quotas, "qgroup" for full accounting (kernels
// before 6.7 have no mode file and only full accounting).
func (s *Snapshotter) quotaMode() (string, error) {
	dir, err := s.qgroupDir()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "mode"))
	if errors.Is(err, fs.ErrNotExist) {
		return "qgroup", nil
	}
	return strings.TrimSpace(string(b)), err
}

// enableQuota turns simple quotas on once per pool. A kernel without them
// (before Linux 6.7) or a pool with full accounting on is refused with
// cr.ErrUnavailable.
func (s *Snapshotter) enableQuota(ctx context.Context) error {
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	if s.quotaOn {
		return nil
	}
	mode, err := s.quotaMode()
	if err != nil {
		return fmt.Errorf("enable quotas: %w", err)
	}
	if mode == "" {
		fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("enable quotas: %w", err)
		}
		defer unix.Close(fd)
		a := quotaCtlArgs{cmd: quotaCtlEnableSimple}
		if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("enable simple quotas: kernel has none (Linux 6.7+ needed): %w: %w", cr.ErrUnavailable, err)
		} else if err != nil {
			return fmt.Errorf("enable simple quotas: %w", err)
		}
		if mode, err = s.quotaMode(); err != nil {
			return fmt.Errorf("enable quotas: %w", err)
		}
		s.log.InfoContext(ctx, "enabled btrfs simple quotas", slog.String("pool", s.root))
	}
	if mode != "squota" {
		return fmt.Errorf("enable quotas: pool %s has qgroup mode %q, want squota (full accounting makes snapshots slow; `btrfs quota disable` it): %w",
			s.root, mode, cr.ErrUnavailable)
	}
	s.quotaOn = true
	return nil
}

// qgroupDir is the pool's qgroups directory in sysfs (present only while
// quotas are on), found once from the pool's fsid.
// qgroupPath is the sysfs directory, below dir (qgroupDir), of the level-0
// qgroup of subvolume treeid.
func qgroupPath(dir string, treeid uint64) string {
	return filepath.Join(dir, "0_"+strconv.FormatUint(treeid, 10))
}

func (s *Snapshotter) qgroupDir() (string, error) {
	s.qdirOnce.Do(func() {
		fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			s.qdirErr = err
			return
		}
		defer unix.Close(fd)
		var info fsInfo
		if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&info)); err != nil {
			s.qdirErr = fmt.Errorf("fs info: %w", err)
			return
		}
		u := info.fsid
		s.qdir = filepath.Join(sysfsBtrfs, fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), "qgroups")
	})
	return s.qdir, s.qdirErr
}

// Quota reads the volume's qgroup from sysfs: what it is charged plus the
// space reserved for writes not yet committed, which is what the kernel
// compares with the limit (the metadata reservations, a few hundred KiB at
// most, are left out). For a volume this Snapshotter capped it costs two
// small sysfs reads and a statfs (about 15 µs); for another, an ioctl and
// three more reads. A pool without quotas answers cr.ErrNotFound.
func (s *Snapshotter) Quota(ctx context.Context, name string) (cr.QuotaUsage, error) {
	var u cr.QuotaUsage
	var err error
	if c, ok := s.capped.Load(name); ok {
		u, err = c.(cappedVolume).usage()
	} else {
		u, err = s.quota(name)
	}
	if err != nil {
		return cr.QuotaUsage{}, fmt.Errorf("read quota of %s: %w", name, err)
	}
	return u, nil
}

func (s *Snapshotter) quota(name string) (cr.QuotaUsage, error) {
	p, err := s.source(name)
	if err != nil {
		return cr.QuotaUsage{}, err
	}
	dir, err := s.qgroupDir()
	if err != nil {
		return cr.QuotaUsage{}, err
	}
	info, err := getSubvolInfo(p)
	if err != nil {
		return cr.QuotaUsage{}, mapErrno(name, err)
	}
	c := cappedVolume{qgroup: qgroupPath(dir, info.treeid), path: p}
	if c.limit, err = readInt(filepath.Join(c.qgroup, "max_referenced")); err != nil {
		return cr.QuotaUsage{}, qgroupErr(err)
	}
	return c.usage()
}

func (c cappedVolume) usage() (cr.QuotaUsage, error) {
	var used, charged int64
	for _, f := range []string{"referenced", "rsv_data"} {
		n, err := readInt(filepath.Join(c.qgroup, f))
		if err != nil {
			return cr.QuotaUsage{}, qgroupErr(err)
		}
		if f == "referenced" {
			charged = n
		}
		used += n
	}
	var st unix.Statfs_t
	if err := unix.Statfs(c.path, &st); err != nil {
		return cr.QuotaUsage{}, err
	}
	u := cr.QuotaUsage{Free: int64(st.Bavail) * st.Bsize, Charged: charged}
	if c.limit > 0 {
		u.Free = min(u.Free, max(0, c.limit-used))
	}
	return u, nil
}

func qgroupErr(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no qgroup (quotas off, or the volume is gone): %w", cr.ErrNotFound)
	}
	return err
}

// readInt reads a number from a sysfs file with bare syscalls: os.ReadFile
// costs three times as much (a stat and the poller), and Quota reads five.
func readInt(path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var buf [32]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return 0, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return strconv.ParseInt(strings.TrimSpace(string(buf[:n])), 10, 64)
}

// pruneEvery is how many Destroy calls go between two sweeps of stale
// qgroups (a sweep reads one sysfs file per qgroup: a few ms for a
// thousand).
const pruneEvery = 64

// pruneQgroups removes the qgroups of subvolumes that are gone and whose
// usage has dropped to zero. Under simple quotas the kernel keeps the
// qgroup of a dropped subvolume while snapshots still hold extents it
// wrote (a sandbox's data in its checkpoints), and leaves it behind, empty,
// when the last of them is dropped; without this they would pile up, one
// per sandbox. The kernel refuses to remove a qgroup that has usage or a
// subvolume; the look-up first is so that a live subvolume's qgroup, and its
// limit, is never even tried.
func (s *Snapshotter) pruneQgroups(ctx context.Context) (removed int, err error) {
	if mode, err := s.quotaMode(); err != nil || mode == "" {
		return 0, err
	}
	dir, _ := s.qgroupDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	for _, e := range ents {
		idStr, ok := strings.CutPrefix(e.Name(), "0_")
		if !ok {
			continue // a level-1+ qgroup, or a mode/enabled file
		}
		id, err := strconv.ParseUint(idStr, 10, 64)
		if err != nil || id < firstFreeObjectID {
			continue // 0/5 is the top level
		}
		if n, err := readInt(filepath.Join(dir, e.Name(), "referenced")); err != nil || n != 0 {
			continue
		}
		if exists, err := subvolExists(fd, id); err != nil || exists {
			continue // the subvolume is there, or being deleted (or we cannot tell)
		}
		a := qgroupCreateArgs{create: 0, qgroupID: id}
		if err := ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a)); err != nil {
			s.log.DebugContext(ctx, "keep qgroup", slog.Uint64("id", id), slog.Any("err", err))
			continue
		}
		removed++
	}
	if removed > 0 {
		s.log.DebugContext(ctx, "removed stale qgroups", slog.Int("n", removed))
	}
	return removed, nil
}

// subvolExists reports whether the root tree still has a root item for
// subvolume id (a deleted subvolume keeps it until the cleaner has dropped
// it), searched with BTRFS_IOC_TREE_SEARCH from fd, any file in the pool.
func subvolExists(fd int, id uint64) (bool, error) {
	a := searchArgs{key: searchKey{
		treeID: rootTreeObjectID, minObjectID: id, maxObjectID: id,
		maxOffset: ^uint64(0), maxTransID: ^uint64(0),
		minType: rootItemKey, maxType: rootItemKey, nrItems: 1,
	}}
	if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
		return false, err
	}
	return a.key.nrItems > 0, nil
}

// Sync commits the pool's transaction and wakes btrfs's cleaner
// (BTRFS_IOC_SYNC), so that the room of destroyed volumes and snapshots
// comes back now instead of after the next periodic commit (30 s by
// default): a plain syncfs commits but leaves dropped subvolumes to the
// cleaner's next round. It does not wait for the cleaner; Settle does,
// and the engine calls that under disk pressure (docs/engine.md, "Disk
// pressure").
func (s *Snapshotter) Sync(ctx context.Context) error {
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync pool: %w", err)
	}
	defer unix.Close(fd)
	if err := ioctl(fd, iocSync, nil); err != nil {
		return fmt.Errorf("sync pool: %w", err)
	}
	return nil
}

// settlePoll is how often Settle commits and looks for deleted
// subvolumes the cleaner has not dropped yet.
const settlePoll = 25 * time.Millisecond

// Settle waits until btrfs's cleaner has dropped every subvolume deleted
// so far, so that statfs shows their room back: it commits and wakes the
// cleaner (Sync) and lists the deleted subvolumes whose root item is still
// there (deadSubvols), again every settlePoll until none is, then commits
// once more, which frees what the cleaner released. It returns ctx's error
// if ctx ends first: a deleted subvolume is not dropped while a process
// still holds a file in it. The engine calls it under disk pressure after
// each eviction pass (docs/engine.md, "Disk pressure").
//
// The list is what `btrfs subvolume sync` waits for. The kernel's own
// count of queued deleted subvolumes (BTRFS_IOC_SUBVOL_SYNC_WAIT's COUNT
// mode) says 0 both while the cleaner is dropping one (it takes it off the
// queue first) and before one is queued at all (a subvolume goes on the
// queue when its last in-memory inode goes), so a Settle built on it
// returned with the room still held; its waiting modes sleep in the
// kernel past any deadline.
func (s *Snapshotter) Settle(ctx context.Context) error {
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("settle pool: %w", err)
	}
	defer unix.Close(fd)
	for {
		if err := ioctl(fd, iocSync, nil); err != nil {
			return fmt.Errorf("settle pool: %w", err)
		}
		dead, err := deadSubvols(fd)
		switch {
		case err != nil:
			return fmt.Errorf("settle pool: %w", err)
		case len(dead) == 0:
			return s.Sync(ctx)
		}
		select {
		case <-ctx.Done():
			ids := fmt.Sprint(dead[:min(len(dead), 10)])
			if len(dead) > 10 {
				ids = strings.TrimSuffix(ids, "]") + " ...]"
			}
			return fmt.Errorf("settle pool: %d deleted subvolumes not dropped yet (ids %s; a file still held in one keeps it): %w", len(dead), ids, ctx.Err())
		case <-time.After(settlePoll):
		}
	}
}

// deadSubvols lists the ids of deleted subvolumes the cleaner has not
// dropped yet, searched from fd, any file in the pool: deleting a
// subvolume leaves an orphan item for it in the root tree, which goes in
// the transaction that drops the subvolume's root item; an orphan whose
// root item is gone already is not listed.
func deadSubvols(fd int) ([]uint64, error) {
	var dead []uint64
	for minOffset := uint64(0); ; {
		a := searchArgs{key: searchKey{
			treeID: rootTreeObjectID, minObjectID: orphanObjectID, maxObjectID: orphanObjectID,
			minOffset: minOffset, maxOffset: ^uint64(0), maxTransID: ^uint64(0),
			minType: orphanItemKey, maxType: orphanItemKey, nrItems: 4096,
		}}
		if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
			return nil, fmt.Errorf("search the root tree for deleted subvolumes: %w", err)
		}
		if a.key.nrItems == 0 {
			return dead, nil
		}
		buf := a.buf[:]
		for range a.key.nrItems {
			if len(buf) < searchHeaderSize {
				return nil, fmt.Errorf("search the root tree for deleted subvolumes: short result")
			}
			id := binary.NativeEndian.Uint64(buf[16:24]) // the item key's offset
			n := int(binary.NativeEndian.Uint32(buf[28:32]))
			if len(buf) < searchHeaderSize+n {
				return nil, fmt.Errorf("search the root tree for deleted subvolumes: short result")
			}
			buf = buf[searchHeaderSize+n:]
			exists, err := subvolExists(fd, id)
			if err != nil {
				return nil, err
			}
			if exists {
				dead = append(dead, id)
			}
			minOffset = id + 1
		}
		if minOffset == 0 { // the last possible id came back
			return dead, nil
		}
	}
}
