package image

import (
	"context"
	"errors"
	"io"

	"golang.org/x/sync/singleflight"
)

// builds shares one build among the concurrent Ensures of an image in
// this process, keyed by the image's path on its backend (one key per
// snapshotter and name, whichever Store asks).
var builds singleflight.Group

// Ensure returns image name, building it from its built-in recipe (Build)
// when it is missing. Concurrent Ensures of one missing image wait for
// one build and all return it: in this process they share the build
// (progress goes to the first caller's writer); another process (or a
// Build) that makes the image first wins the race at its final snapshot,
// which is atomic, and the loser's ErrExists counts as success. A shared
// build runs under the first caller's ctx: when that ends it, the
// callers whose own ctx is still live try again.
func (s *Store) Ensure(ctx context.Context, name string, progress io.Writer) (Info, error) {
	for {
		in, err := s.Get(ctx, name)
		if !errors.Is(err, ErrNotFound) {
			return in, err
		}
		_, err, shared := builds.Do(s.Snap.Path(SnapshotName(name)), func() (any, error) {
			if err := s.Build(ctx, name, progress); err != nil && !errors.Is(err, ErrExists) {
				return nil, err
			}
			return nil, nil
		})
		if shared && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			continue // the first caller's ctx ended its build, not ours
		}
		if err != nil {
			return Info{}, err
		}
		return s.Get(ctx, name)
	}
}
