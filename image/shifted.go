package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbor-env/arbor/cr"
)

// ShiftedPrefix is where images shifted for user namespace mode live, one
// snapshot per image and range: ShiftedPrefix + name + ":" + first host id.
// It lies outside Prefix, so List shows images, not their shifted copies.
const ShiftedPrefix = "images-userns/"

// ShiftedName is the snapshot name of image name shifted to the range that
// starts at host id base.
func ShiftedName(name string, base uint32) string {
	return ShiftedPrefix + name + ":" + strconv.FormatUint(uint64(base), 10)
}

// shiftMu serialises making shifted copies: two launches of one image must
// not both make it (shifting is rare, once per image and range).
var shiftMu sync.Mutex

// Shifted returns image name as sandboxes in user namespace mode need it:
// a snapshot whose files belong to the host ids base..base+size-1 (see
// Shift; docs/sandbox.md, "User namespace mode"). It is made on first use
// from the image and kept; an image replaced since (other metadata) gets a
// fresh copy. The copy shares the image's data on copy-on-write backends:
// only the inodes are rewritten.
func (s *Store) Shifted(ctx context.Context, name string, base, size uint32) (Info, error) {
	img, err := s.Get(ctx, name)
	if err != nil {
		return Info{}, err
	}
	sn := ShiftedName(name, base)
	shifted := img
	shifted.Snapshot, shifted.Path = sn, s.Snap.Path(sn)
	shiftMu.Lock()
	defer shiftMu.Unlock()
	vols, err := s.Snap.List(ctx, sn)
	if err != nil {
		return Info{}, fmt.Errorf("list snapshots: %w", err)
	}
	for _, v := range vols {
		if v.Name != sn {
			continue
		}
		if sameMetadata(img.Path, shifted.Path) {
			return shifted, nil
		}
		// The image was replaced: its old shifted copy goes.
		if err := s.Snap.Destroy(ctx, sn); err != nil && !errors.Is(err, cr.ErrNotFound) {
			return Info{}, fmt.Errorf("remove stale shifted image %s: %w", sn, err)
		}
	}
	log := s.logger().With(slog.String("image", name))
	start := time.Now()
	tmp, done, err := s.newBuild(ctx, log, name+"-userns", img.Snapshot)
	if err != nil {
		return Info{}, fmt.Errorf("clone image %s to shift it: %w", name, err)
	}
	defer done()
	if err := Shift(s.Snap.Path(tmp), base, size); err != nil {
		return Info{}, fmt.Errorf("shift image %s: %w", name, err)
	}
	if err := s.Snap.Snapshot(ctx, tmp, sn); err != nil {
		return Info{}, fmt.Errorf("snapshot shifted image %s: %w", name, err)
	}
	log.Info("image shifted for user namespace mode", slog.Uint64("host_id", uint64(base)), slog.Duration("took", time.Since(start)))
	return shifted, nil
}

// sameMetadata reports whether two image roots carry the same metadata
// file (a shifted copy and the image it was made from).
func sameMetadata(a, b string) bool {
	x, err := os.ReadFile(filepath.Join(a, MetadataPath))
	if err != nil {
		return false
	}
	y, err := os.ReadFile(filepath.Join(b, MetadataPath))
	return err == nil && bytes.Equal(x, y)
}

// removeShifted destroys the shifted copies of image name.
func (s *Store) removeShifted(ctx context.Context, name string) error {
	vols, err := s.Snap.List(ctx, ShiftedPrefix+name+":")
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	var errs []error
	for _, v := range vols {
		if rest, ok := strings.CutPrefix(v.Name, ShiftedPrefix+name+":"); !ok || strings.Contains(rest, "/") {
			continue
		}
		if err := s.Snap.Destroy(ctx, v.Name); err != nil && !errors.Is(err, cr.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
