package branch

import (
	"context"
	"errors"
	"log/slog"

	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/arbor-env/arbor/cr/manifest"
)

// DefaultDeltaChain is how many delta images may stand on one whole
// process image (Options.DeltaChain).
const DefaultDeltaChain = 8

// deltaImage makes the process image of whole bytes just dumped into dir
// a delta of the parent state's image baseID (cr/imgdelta; docs/engine.md,
// "Delta images"), unless delta images are off, there is no base, the
// base's chain is already Options.DeltaChain long, or the image is one a
// restore brings back lazily (Options.LazyBytes): CRIU's lazy-pages daemon
// does not serve pages from a parent image, so a delta would lose the lazy
// restore most of its memory; nor of a tree in its own user namespace,
// whose every restore would have to read a flattened copy (cr/criu). It returns the base's
// artifact id and what the delta kept ("" and no error: the image stays
// whole). An error that left dir whole is logged and the image stays
// whole; only a damaged dir fails the checkpoint.
func (e *Engine) deltaImage(ctx context.Context, dir string, whole int64, baseID string, userNS bool) (string, imgdelta.Stats, error) {
	var st imgdelta.Stats
	if e.o.DeltaChain < 0 || baseID == "" || userNS || e.lazy(manifest.Artifact{Bytes: whole}) {
		return "", st, nil
	}
	base, err := e.man.GetArtifact(baseID)
	if err != nil {
		return "", st, nil // the parent's image is not here (an imported lineage)
	}
	depth := 0
	for a := base; a.Base != ""; depth++ {
		if depth+1 >= e.o.DeltaChain {
			return "", st, nil // the chain is full: this image is whole
		}
		if a, err = e.man.GetArtifact(a.Base); err != nil {
			e.log.Warn("delta image: base chain", slog.String("base", baseID), slog.Any("err", err))
			return "", st, nil
		}
	}
	bdir, release, err := e.cache.Acquire(ctx, base.Location)
	if err != nil {
		e.log.Warn("delta image: acquire base", slog.String("base", baseID), slog.Any("err", err))
		return "", st, nil
	}
	defer release()
	st, err = imgdelta.Make(dir, bdir, base.Location)
	if errors.Is(err, imgdelta.ErrDamaged) {
		return "", st, err
	}
	if err != nil {
		e.log.Warn("delta image: kept whole", slog.String("base", baseID), slog.Any("err", err))
		return "", st, nil
	}
	if !st.Delta() {
		return "", st, nil // nothing left to the base: whole
	}
	e.stats.deltaImages.Add(1)
	e.stats.deltaSaved.Add(st.Before - st.After)
	return base.ID, st, nil
}

// wholeBytes is a process image's size as CRIU dumped it, before it
// became a delta: what a restore of it brings back.
func wholeBytes(a manifest.Artifact) int64 { return max(a.Bytes, a.Whole) }
