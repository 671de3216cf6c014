package btrfs

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/internal/fsdiff"
)

// Changes lists the paths that differ between base and target. Both may be
// volumes or snapshots; a writable one is first frozen in a temporary
// read-only snapshot, because btrfs send only reads read-only subvolumes.
//
// The candidates come from `btrfs send --no-data -p base target | btrfs
// receive --dump`: every path a command of the stream names (mkfile, mkdir,
// mknod, mkfifo, mksock, symlink, link, unlink, rmdir, rename source and
// destination, write/update_extent, truncate, clone, chmod, chown, utimes,
// set_xattr, remove_xattr). Each candidate is then classified by
// cr/internal/fsdiff against the two trees, so the rule for what counts is
// the same as the zfs backend's: paths that exist on one side only are
// Added/Deleted (with all descendants of a directory, so a renamed
// directory shows as its old tree deleted and its new tree added); a path on
// both sides is Modified when its type, inode, mode, owner, device, symlink
// target or xattrs differ, when a non-directory's size or mtime differs,
// or when the stream wrote its data. A utimes command alone (atime, ctime,
// or a directory's mtime after its entries changed) is not a change;
// transient files (made and removed between the two snapshots) never appear.
func (s *Snapshotter) Changes(ctx context.Context, base, target string) (_ []cr.Change, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("changes %s..%s: %w", base, target, err)
		}
	}()
	if _, err := exec.LookPath("btrfs"); err != nil {
		return nil, fmt.Errorf("btrfs-progs not installed (run make deps): %w", cr.ErrUnavailable)
	}
	basePath, err := s.frozen(base)
	if err != nil {
		return nil, err
	}
	defer basePath.release()
	targetPath, err := s.frozen(target)
	if err != nil {
		return nil, err
	}
	defer targetPath.release()

	ops, err := sendDump(ctx, basePath.path, targetPath.path)
	if err != nil {
		return nil, err
	}
	candidates := map[string]bool{} // path -> its data was written
	for _, op := range ops {
		candidates[op.path] = candidates[op.path] || contentOps[op.cmd]
		if op.dest != "" {
			candidates[op.dest] = candidates[op.dest] || false
		}
	}
	set := fsdiff.Set{}
	for p, written := range candidates {
		if err := set.Compare(ctx, basePath.path, targetPath.path, p, written); err != nil {
			return nil, err
		}
	}
	return set.Sorted(), nil
}

// frozenVol is a read-only subvolume path, possibly a temporary snapshot.
type frozenVol struct {
	path    string
	release func()
}

func (s *Snapshotter) frozen(name string) (frozenVol, error) {
	p, err := s.source(name)
	if err != nil {
		return frozenVol{}, err
	}
	info, err := getSubvolInfo(p)
	if err != nil {
		return frozenVol{}, mapErrno(name, err)
	}
	if info.flags&rootSubvolRdonly != 0 {
		return frozenVol{p, func() {}}, nil
	}
	tmp, release, err := s.tmpSnapshot(p)
	if err != nil {
		return frozenVol{}, fmt.Errorf("freeze %s: %w", name, mapErrno(name, err))
	}
	return frozenVol{tmp, release}, nil
}

// sendDump runs btrfs send | btrfs receive --dump and parses the result.
func sendDump(ctx context.Context, parent, snap string) ([]dumpOp, error) {
	send := exec.CommandContext(ctx, "btrfs", "send", "--no-data", "-q", "-p", parent, snap)
	dump := exec.CommandContext(ctx, "btrfs", "receive", "--dump")
	var sendErr, dumpErr, out bytes.Buffer
	send.Stderr = &sendErr
	dump.Stderr = &dumpErr
	dump.Stdout = &out
	pipe, err := send.StdoutPipe()
	if err != nil {
		return nil, err
	}
	dump.Stdin = pipe
	if err := send.Start(); err != nil {
		return nil, err
	}
	if err := dump.Start(); err != nil {
		send.Process.Kill()
		send.Wait()
		return nil, err
	}
	errDump := dump.Wait()
	errSend := send.Wait()
	if errSend != nil {
		return nil, fmt.Errorf("btrfs send: %w: %s", errSend, strings.TrimSpace(sendErr.String()))
	}
	if errDump != nil {
		return nil, fmt.Errorf("btrfs receive --dump: %w: %s", errDump, strings.TrimSpace(dumpErr.String()))
	}
	return parseDump(&out)
}
