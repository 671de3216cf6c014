package inspector

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"strings"
)

// TreeDiff lists the sandbox paths whose state (existence, type, mode,
// owner, size, symlink target, content, xattrs) differs between two trees,
// e.g. the live root and the snapshot a skipped checkpoint relies on: the
// verification of --verify-skips. Mounts no snapshot holds are left out.
// Contents are compared as PathChanged does (data extents only, ctx
// checked between chunks) but without a byte cap: a file that could not
// be read through would be reported as a miss it is not, so the bound
// here is ctx. It gives up with ErrStalled when ctx's deadline passes
// while the file system does not answer.
func TreeDiff(ctx context.Context, liveRoot, snapRoot string) ([]string, error) {
	return bounded(ctx, func() ([]string, error) { return treeDiff(ctx, liveRoot, snapRoot) })
}

func treeDiff(ctx context.Context, liveRoot, snapRoot string) ([]string, error) {
	seen := map[string]bool{}
	for _, root := range []string{liveRoot, snapRoot} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
			if len(SnapshotPath(rel)) == 0 {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			seen[rel] = true
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", root, err)
		}
	}
	var diff []string
	bud := NewBudget(math.MaxInt64)
	for p := range seen {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		changed, err := pathChanged(ctx, bud, liveRoot, snapRoot, p)
		if err != nil {
			return nil, err
		}
		if changed {
			diff = append(diff, p)
		}
	}
	slices.Sort(diff)
	return diff, nil
}
