package btrfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"github.com/arbor-env/arbor/cr"
	"golang.org/x/sys/unix"
)

var _ cr.Quotaer = (*Snapshotter)(nil)

// sysfsBtrfs is where the kernel shows each mounted btrfs, by fsid.
const sysfsBtrfs = "/sys/fs/btrfs"

// SetQuota caps volume name with a referenced limit on its qgroup (see
// cr.Quotaer for why referenced, not exclusive). The first cap turns on
// qgroup accounting for the whole pool (BTRFS_IOC_QUOTA_CTL) and waits for
// the rescan of what the pool already holds; later calls are one
// BTRFS_IOC_QGROUP_LIMIT. The kernel drops a subvolume's qgroup when it
// drops the subvolume (since Linux 6.11 or so), so Destroy needs nothing
// more and qgroups do not pile up.
func (s *Snapshotter) SetQuota(ctx context.Context, name string, bytes int64) error {
	p, err := s.source(name)
	if err == nil {
		err = s.setQuota(ctx, p, bytes)
	}
	if err != nil {
		return fmt.Errorf("set quota of %s: %w", name, mapErrno(name, err))
	}
	return nil
}

func (s *Snapshotter) setQuota(ctx context.Context, p string, bytes int64) error {
	a := qgroupLimitArgs{flags: qgroupLimitMaxRfer, maxRfer: uint64(bytes)}
	if bytes <= 0 {
		dir, err := s.qgroupDir()
		if err != nil {
			return err
		}
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return nil // quotas off: nothing is capped
		}
		a.maxRfer = qgroupLimitClear
	} else if err := s.enableQuota(ctx); err != nil {
		return fmt.Errorf("enable quotas: %w", err)
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// Qgroup id 0 is the subvolume the ioctl is called on.
	return ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a))
}

// enableQuota turns on qgroup accounting once per pool. Enabling scans
// everything already in the pool; the wait makes the first limit count
// from that scan's result instead of from zero.
func (s *Snapshotter) enableQuota(ctx context.Context) error {
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	if s.quotaOn {
		return nil
	}
	dir, err := s.qgroupDir()
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		s.quotaOn = true // enabled by an earlier run
		return nil
	}
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	a := quotaCtlArgs{cmd: quotaCtlEnable}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("quota ctl: %w", err)
	}
	if err := ioctl(fd, iocQuotaRescanWait, nil); err != nil {
		return fmt.Errorf("wait for quota rescan: %w", err)
	}
	s.quotaOn = true
	s.log.InfoContext(ctx, "enabled btrfs quotas", slog.String("pool", s.root))
	return nil
}

// qgroupDir is the pool's qgroups directory in sysfs (present only while
// quotas are on), found once from the pool's fsid.
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

// Quota reads the volume's qgroup from sysfs: referenced bytes plus the
// space reserved for writes not yet committed, which is what the kernel
// compares with the limit. It costs one ioctl, a statfs and five small
// sysfs reads. A pool without quotas answers cr.ErrNotFound.
func (s *Snapshotter) Quota(ctx context.Context, name string) (cr.QuotaUsage, error) {
	u, err := s.quota(name)
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
	qg := filepath.Join(dir, "0_"+strconv.FormatUint(info.treeid, 10))
	var v [5]int64
	for i, f := range []string{"referenced", "rsv_data", "rsv_meta_pertrans", "rsv_meta_prealloc", "max_referenced"} {
		if v[i], err = readInt(filepath.Join(qg, f)); errors.Is(err, fs.ErrNotExist) {
			return cr.QuotaUsage{}, fmt.Errorf("no qgroup (quotas off?): %w", cr.ErrNotFound)
		} else if err != nil {
			return cr.QuotaUsage{}, err
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return cr.QuotaUsage{}, err
	}
	u := cr.QuotaUsage{Used: v[0] + v[1] + v[2] + v[3], Free: int64(st.Bavail) * st.Bsize}
	if limit := v[4]; limit > 0 {
		u.Free = min(u.Free, max(0, limit-u.Used))
	}
	return u, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
