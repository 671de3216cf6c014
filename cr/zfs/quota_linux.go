package zfs

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/arbor-env/arbor/cr"
	gozfs "github.com/mistifyio/go-zfs/v3"
	"golang.org/x/sys/unix"
)

var _ cr.Quotaer = (*Snapshotter)(nil)

// SetQuota sets the dataset's refquota (see cr.Quotaer). Not `quota`:
// that counts the dataset's snapshots too, and in this backend those are
// the checkpoints taken of the volume (src@arbor-…), which the sandbox
// cannot delete and which `zfs promote` moves between datasets on Destroy.
// ZFS refuses a refquota below what the dataset already refers to (a clone
// of a state that was at its cap can be a few blocks over it): then the cap
// is set at what it refers to, so the clone starts full instead of
// failing.
func (s *Snapshotter) SetQuota(ctx context.Context, name string, bytes int64) error {
	if err := s.setQuota(ctx, name, bytes); err != nil {
		return fmt.Errorf("set quota of %s: %w", name, err)
	}
	return nil
}

func (s *Snapshotter) setQuota(ctx context.Context, name string, bytes int64) error {
	if err := s.source(name); err != nil {
		return err
	}
	ds := &gozfs.Dataset{Name: s.ds(name)}
	val := "none"
	if bytes > 0 {
		val = strconv.FormatInt(bytes, 10)
	}
	err := ds.SetProperty("refquota", val)
	if err == nil || bytes <= 0 || !strings.Contains(err.Error()+stderrOf(err), "less than current used") {
		return mapErr(name, err)
	}
	out, rerr := output(ctx, "get", "-Hp", "-o", "value", "referenced", ds.Name)
	if rerr != nil {
		return rerr
	}
	ref, perr := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if perr != nil || ref <= bytes {
		return mapErr(name, err)
	}
	return mapErr(name, ds.SetProperty("refquota", strconv.FormatInt(ref, 10)))
}

// Quota reads the dataset's statfs, which ZFS bounds by the refquota: no
// zfs command runs (each costs 30-200 ms on zfs-fuse).
func (s *Snapshotter) Quota(ctx context.Context, name string) (cr.QuotaUsage, error) {
	if err := cr.CheckName(name); err != nil {
		return cr.QuotaUsage{}, fmt.Errorf("read quota of %s: %w", name, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.Path(name), &st); err != nil {
		return cr.QuotaUsage{}, fmt.Errorf("read quota of %s: %w", name, err)
	}
	return cr.QuotaUsage{Used: int64(st.Blocks-st.Bfree) * st.Bsize, Free: int64(st.Bavail) * st.Bsize}, nil
}
