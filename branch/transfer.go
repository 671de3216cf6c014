package branch

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/cr/transfer"
	"github.com/arbor-env/arbor/state"
)

// ImportHold is how long an imported state is kept beyond what the
// retention says, so that the branch or migration it was shipped for
// finds it even with Options.Retain 0.
const ImportHold = time.Minute

// Offer is what a sender tells a receiver of a state it will ship: the
// state and the artifacts the receiver may hold already, so that the
// stream leaves them out or uses one as the base of an incremental file
// snapshot (docs/cluster.md, "State transfer").
type Offer struct {
	State string `json:"state"`
	// Artifacts are the state's own artifact ids and then, nearest first,
	// the file snapshots of its ancestors.
	Artifacts []string `json:"artifacts"`
}

// Holding is what a receiver answers an Offer with.
type Holding struct {
	// State: the receiver has the state already (nothing to ship).
	State bool `json:"state"`
	// Artifacts are the offered artifacts it holds, ready.
	Artifacts []string `json:"artifacts,omitempty"`
}

// PartStats describe one artifact of a transfer.
type PartStats struct {
	ID   string                `json:"id"`
	Kind manifest.ArtifactKind `json:"kind"`
	// Bytes of the part in the stream.
	Bytes int64 `json:"bytes"`
	// Base is the fs artifact a file snapshot was sent against ("":
	// whole).
	Base string `json:"base,omitempty"`
}

// TransferStats describe one state's transfer, on either side.
type TransferStats struct {
	State string `json:"state"`
	// Bytes is the whole stream, header and trailer included.
	Bytes int64       `json:"bytes"`
	Parts []PartStats `json:"parts,omitempty"`
	// Held: the receiver had the state already; nothing was shipped.
	Held bool          `json:"held,omitempty"`
	Took time.Duration `json:"took"`
}

// streamer is the snapshot backend's send/receive, or why there is none.
func (e *Engine) streamer() (cr.Streamer, error) {
	s, ok := e.o.Snap.(cr.Streamer)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend cannot stream snapshots to another node (btrfs send/receive only; zfs send -i is not built yet)",
			ErrUnsupported, e.o.Snap.Backend())
	}
	return s, nil
}

// Offer lists what the receiver of state sid may already hold.
func (e *Engine) Offer(sid string) (Offer, error) {
	line, err := e.Lineage(sid)
	if err != nil {
		return Offer{}, err
	}
	st := line[len(line)-1]
	o := Offer{State: sid}
	for _, id := range []string{st.FS, st.Proc} {
		if id != "" {
			o.Artifacts = append(o.Artifacts, id)
		}
	}
	seen := map[string]bool{st.FS: true}
	for i := len(line) - 2; i >= 0; i-- {
		if id := line[i].FS; id != "" && !seen[id] {
			seen[id] = true
			o.Artifacts = append(o.Artifacts, id)
		}
	}
	return o, nil
}

// Holds answers an Offer: whether the engine has the state, and which of
// the offered artifacts it holds ready.
func (e *Engine) Holds(o Offer) Holding {
	var h Holding
	if _, err := e.man.GetState(o.State); err == nil {
		h.State = true
	}
	for _, id := range o.Artifacts {
		if a, err := e.man.GetArtifact(id); err == nil && a.Ready {
			h.Artifacts = append(h.Artifacts, id)
		}
	}
	return h
}

// Export writes state sid to w as one transfer stream (package
// cr/transfer): its record, its file snapshot unless the receiver holds
// it (have), as a btrfs send stream against the nearest ancestor's
// snapshot the receiver holds, else whole, and its process image as a
// tar unless the receiver holds it. The state is kept from GC while it
// is written.
func (e *Engine) Export(ctx context.Context, sid string, have []string, w io.Writer) (stats TransferStats, err error) {
	start := time.Now()
	defer func() {
		stats.Took = time.Since(start)
		if err != nil {
			err = fmt.Errorf("export state %s: %w", sid, err)
		}
	}()
	stats.State = sid
	snap, err := e.streamer()
	if err != nil {
		return stats, err
	}
	e.gcMu.RLock()
	e.hold(sid)
	line, err := e.Lineage(sid)
	e.gcMu.RUnlock()
	defer e.unhold(sid)
	if err != nil {
		return stats, err
	}
	st := line[len(line)-1]
	env, err := e.man.GetEnv(st.Env)
	if err != nil {
		return stats, err
	}
	held := map[string]bool{}
	for _, id := range have {
		held[id] = true
	}
	hdr := transfer.Header{Image: env.Image, Origin: env.Origin, Labels: env.Labels, State: st}
	hdr.State.Released, hdr.State.ClosedAt, hdr.State.Pinned, hdr.State.Timings = false, time.Time{}, false, nil
	type part struct {
		a    manifest.Artifact
		base manifest.Artifact
	}
	var parts []part
	if st.FS != "" && !held[st.FS] {
		a, err := e.man.GetArtifact(st.FS)
		if err != nil {
			return stats, err
		}
		p := part{a: a}
		for i := len(line) - 2; i >= 0; i-- {
			if id := line[i].FS; id != "" && id != st.FS && held[id] {
				if p.base, err = e.man.GetArtifact(id); err != nil {
					return stats, err
				}
				break
			}
		}
		parts = append(parts, p)
	}
	if st.Proc != "" && !held[st.Proc] {
		a, err := e.man.GetArtifact(st.Proc)
		if err != nil {
			return stats, err
		}
		parts = append(parts, part{a: a})
	}
	for _, p := range parts {
		a := p.a
		a.Ready = false
		hdr.Parts = append(hdr.Parts, transfer.Part{Artifact: a, Base: p.base.ID})
	}
	tw, err := transfer.NewWriter(w, hdr)
	if err != nil {
		return stats, err
	}
	for _, p := range parts {
		pw, err := tw.Part()
		if err != nil {
			return stats, err
		}
		before := tw.Bytes()
		switch p.a.Kind {
		case manifest.ArtifactFS:
			err = snap.Send(ctx, p.a.Location, p.base.Location, pw)
		case manifest.ArtifactProc:
			err = e.sendImage(ctx, p.a.Location, pw)
		}
		if err == nil {
			err = pw.Close()
		}
		if err != nil {
			return stats, fmt.Errorf("%s artifact %s: %w", p.a.Kind, p.a.ID, err)
		}
		stats.Parts = append(stats.Parts, PartStats{ID: p.a.ID, Kind: p.a.Kind, Bytes: tw.Bytes() - before, Base: p.base.ID})
	}
	if err := tw.Close(); err != nil {
		return stats, err
	}
	stats.Bytes = tw.Bytes()
	return stats, nil
}

// sendImage writes process image id as a tar of its directory.
func (e *Engine) sendImage(ctx context.Context, id string, w io.Writer) error {
	dir, release, err := e.cache.Acquire(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	// A delta travels whole: the receiver holds none of its chain.
	dir, done, err := imgdelta.FlatCopy(dir)
	if err != nil {
		return fmt.Errorf("flatten delta image %s: %w", id, err)
	}
	defer done()
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("image file %s is neither a file nor a folder", p)
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(p[len(dir)+1:])
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// receiveImage unpacks a tar written by sendImage into dir.
func receiveImage(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read image tar: %w", err)
		}
		name := filepath.FromSlash(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("image tar names %q, outside the image", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("image tar entry %q of type %c", h.Name, h.Typeflag)
		}
	}
}

// Import reads one transfer stream (Export's) and commits its state here
// once the stream's checksum matched: the artifacts it lacked are
// written (a file snapshot with btrfs receive, a process image into the
// image store) under intents, so that neither a stream cut short or
// damaged, nor a crash, leaves anything behind; then the state is
// committed released, with its retention from now (manifest.ImportState)
// and kept at least ImportHold. A state the engine holds already is read
// to the end and verified, and Held is set. Imports run one at a time.
func (e *Engine) Import(ctx context.Context, r io.Reader) (stats TransferStats, err error) {
	start := time.Now()
	defer func() {
		stats.Took = time.Since(start)
		if err != nil {
			err = fmt.Errorf("%w: import state %s: %w", ErrTransfer, stats.State, err)
		}
	}()
	snap, err := e.streamer()
	if err != nil {
		return stats, err
	}
	e.importMu.Lock()
	defer e.importMu.Unlock()
	tr, err := transfer.NewReader(r)
	if err != nil {
		return stats, err
	}
	hdr := tr.Header()
	st := hdr.State
	stats.State = st.ID
	if _, err := e.man.GetState(st.ID); err == nil {
		stats.Held = true
		if err := tr.Verify(); err != nil {
			return stats, err
		}
		stats.Bytes = tr.Bytes()
		return stats, nil
	}
	inStream := map[string]bool{}
	for _, p := range hdr.Parts {
		inStream[p.Artifact.ID] = true
	}
	// An artifact the stream carries and this node got meanwhile (another
	// state's import shared it) is read past, not written twice.
	skip := map[string]bool{}
	for _, id := range []string{st.FS, st.Proc} {
		if id == "" {
			continue
		}
		a, err := e.man.GetArtifact(id)
		held := err == nil && a.Ready
		switch {
		case held && inStream[id]:
			skip[id] = true
		case !held && !inStream[id]:
			return stats, fmt.Errorf("the stream lacks artifact %s, which this node does not hold", id)
		}
	}
	var made []manifest.Artifact
	defer func() {
		if err != nil {
			for _, a := range made {
				e.deleteArtifact(context.Background(), a)
				if aerr := e.man.AbortArtifact(a.ID); aerr != nil {
					e.log.Warn("drop intent of a failed import", slog.String("artifact", a.ID), slog.Any("err", aerr))
				}
			}
		}
	}()
	var procs []string
	for _, p := range hdr.Parts {
		part, err := tr.Next()
		if err != nil {
			return stats, err
		}
		a := p.Artifact
		if skip[a.ID] {
			continue // Next skips what is left of it
		}
		// Where an artifact lives follows from its id, as the engine
		// names them: a stream cannot write anywhere else.
		want := a.ID
		if a.Kind == manifest.ArtifactFS {
			want = SnapshotPrefix + a.ID
		}
		if a.Location != want || strings.ContainsAny(a.ID, "/.") {
			return stats, fmt.Errorf("artifact %s at %q: want %q", a.ID, a.Location, want)
		}
		// Images arrive whole (sendImage flattens a delta), whatever the
		// sender's record says of its own copy.
		a.Base, a.Whole = "", 0
		if err := e.man.BeginArtifact(a); err != nil {
			return stats, err
		}
		made = append(made, a)
		before := tr.Bytes()
		switch a.Kind {
		case manifest.ArtifactFS:
			if p.Base != "" {
				if b, err := e.man.GetArtifact(p.Base); err != nil || !b.Ready {
					return stats, fmt.Errorf("file snapshot %s is sent against %s, which this node does not hold", a.ID, p.Base)
				}
			}
			if err := snap.Receive(ctx, a.Location, part); err != nil {
				return stats, err
			}
		case manifest.ArtifactProc:
			dir, err := e.cache.NewDir(a.Location)
			if err != nil {
				return stats, err
			}
			if err := receiveImage(part, dir); err != nil {
				return stats, fmt.Errorf("process image %s: %w", a.ID, err)
			}
			procs = append(procs, a.ID)
		}
		if _, err := io.Copy(io.Discard, part); err != nil {
			return stats, err
		}
		stats.Parts = append(stats.Parts, PartStats{ID: a.ID, Kind: a.Kind, Bytes: tr.Bytes() - before, Base: p.Base})
	}
	if err := tr.Verify(); err != nil {
		return stats, err
	}
	stats.Bytes = tr.Bytes()
	ids := make([]string, 0, len(made))
	for _, a := range made {
		ids = append(ids, a.ID)
	}
	for _, id := range procs {
		n, err := e.cache.Commit(id)
		if err != nil {
			return stats, fmt.Errorf("keep process image: %w", err)
		}
		if err := e.man.SetArtifactBytes(id, n); err != nil {
			return stats, err
		}
	}
	e.gcMu.RLock()
	err = e.man.ImportState(manifest.Env{ID: st.Env, Image: hdr.Image, Origin: hdr.Origin, Labels: hdr.Labels}, st, e.now(), ids...)
	if err == nil {
		e.hold(st.ID)
	}
	e.gcMu.RUnlock()
	if err != nil {
		return stats, err
	}
	made = nil
	time.AfterFunc(ImportHold, func() { e.unhold(st.ID); e.nudgeGC() })
	e.log.Info("imported state", slog.String("state", st.ID), slog.String("env", st.Env), slog.Int64("bytes", stats.Bytes),
		slog.Duration("took", time.Since(start)))
	return stats, nil
}

// ImportedLabels are the labels of env id when the engine knows it only
// from a state imported from another node (manifest.Env.Imported): what
// its owner there kept on it (task, base turn, seed), so that a branch of
// that state here inherits them as it would there.
func (e *Engine) ImportedLabels(id string) (map[string]string, bool) {
	rec, err := e.man.GetEnv(id)
	if err != nil || !rec.Imported {
		return nil, false
	}
	return rec.Labels, true
}

// Labels are the labels recorded on env id, open or closed (SetLabels).
func (e *Engine) Labels(id string) (map[string]string, bool) {
	rec, err := e.man.GetEnv(id)
	return rec.Labels, err == nil
}

// Freeze stops env for a migration and returns the state it stands at
// and a thaw that resumes the env when the migration fails. It waits for
// env's pending checkpoint and freezes its sandbox; then, frozen, the
// Inspector says whether anything changed since the last checkpoint (a
// background process that wrote files or ran after the last turn's
// checkpoint): if so a checkpoint of what changed is taken now, still
// frozen, and becomes env's head, so that the env moves with what it did
// (docs/cluster.md, "Live migration"); otherwise the head is returned.
// Without an Inspector that checkpoint is always taken, full. An env
// whose checkpoint failed is refused (its head is behind what it did):
// the next operation reports the failure and checkpoints it full.
func (e *Engine) Freeze(ctx context.Context, env *Env) (head string, thaw func(), err error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	if err := env.usable(); err != nil {
		return "", nil, err
	}
	if _, err := env.gate(ctx); err != nil {
		return "", nil, err
	}
	if env.ckptErr != nil || env.mustFull || env.head == "" {
		return "", nil, fmt.Errorf("%w: env %s has no committed state equal to it (its last checkpoint failed)", state.ErrCheckpoint, env.ID)
	}
	sb := env.sb
	// As a checkpoint freezes: the server's connection into the shell
	// closed first (a dump of a tree holding it fails); no other opens
	// while env.mu and the env's ticket are held.
	if err := sb.Exclusive(sb.Freeze); err != nil {
		return "", nil, fmt.Errorf("freeze env %s: %w", env.ID, err)
	}
	thaw = func() {
		if err := sb.Thaw(); err != nil {
			e.log.Warn("thaw env after a failed migration", slog.String("env", env.ID), slog.Any("err", err))
		}
	}
	kind, why := state.Full, []string{"no inspector"}
	if in := e.o.Inspector; in != nil {
		k, reasons, err := in.Settle(ctx, env.ID, state.None, e.target(sb, env.volume, env.headFS(), ""))
		kind, why = k, reasons
		if err != nil {
			kind, why = state.Full, append(why, err.Error())
		}
	}
	if kind == state.None {
		return env.head, thaw, nil
	}
	if _, _, _, err := e.submitCheckpoint(ctx, env, kind, queue.High, true); err != nil {
		thaw()
		return "", nil, err
	}
	if err := env.awaitCheckpoint(ctx); err != nil {
		thaw()
		return "", nil, fmt.Errorf("checkpoint env %s for its migration: %w", env.ID, err)
	}
	e.log.Info("checkpointed a changed env for its migration", slog.String("env", env.ID), slog.String("state", env.head),
		slog.String("kind", string(kind)), slog.Any("why", why))
	return env.head, thaw, nil
}

// AdoptImported opens env id here at state head, imported from the node
// where the env lived (a migration's target), with the env's image and
// labels: its record, made when its states were imported (or now, for a
// branch child that made no state of its own yet, whose head is its
// origin's), is opened again with its lineage unreleased
// (manifest.ReopenEnv) and head is restored under the same env id, as a
// crash recovery restores an env. On failure the record is closed again.
func (e *Engine) AdoptImported(ctx context.Context, id, head, image string, labels map[string]string) (env *Env, err error) {
	if _, err := e.Env(id); err == nil {
		return nil, fmt.Errorf("%w: env %s is open here already", state.ErrInvalid, id)
	}
	st, err := e.State(head)
	if err != nil {
		return nil, err
	}
	rec, err := e.man.GetEnv(id)
	switch {
	case errors.Is(err, manifest.ErrNotFound):
		rec = manifest.Env{ID: id, Image: image, Labels: labels, Imported: true, Closed: true}
		if err := e.man.PutEnv(rec); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case !rec.Imported || !rec.Closed:
		return nil, fmt.Errorf("%w: env %s was not imported from another node", state.ErrInvalid, id)
	}
	if labels == nil {
		labels = rec.Labels
	}
	if err := e.man.ReopenEnv(id, head, labels); err != nil {
		return nil, err
	}
	rec.Labels = labels
	defer func() {
		if err != nil {
			if cerr := e.man.ReleaseEnvAt(id, e.now()); cerr != nil {
				e.log.Warn("close the record of a failed adoption", slog.String("env", id), slog.Any("err", cerr))
			}
		}
	}()
	// A name of its own: on one host (nodes side by side, as in the
	// tests) the source's sandbox, frozen, still holds id-<generation>.
	e.gcMu.RLock()
	r, err := e.restore(ctx, head, state.NewID(id+"-m"))
	e.gcMu.RUnlock()
	if err != nil {
		return nil, err
	}
	// Its origin lives on the other node: nothing to promote into here.
	env = &Env{ID: id, Image: rec.Image, sb: r.sb, volume: r.volume, head: head, pubHead: head,
		fsLoc: r.fsLoc, stats: &e.stats, labels: rec.Labels}
	env.turn.Store(int64(st.Turn))
	if err := e.register(env); err != nil {
		e.discard(r)
		return nil, err
	}
	e.track(ctx, env, r.imageShell)
	return env, nil
}

// CommittedHead is env id's last committed state (its manifest head),
// without waiting for a checkpoint or operation in progress.
func (e *Engine) CommittedHead(id string) (string, error) {
	rec, err := e.man.GetEnv(id)
	if err != nil || rec.Closed {
		return "", fmt.Errorf("%w: %s", state.ErrUnknownEnv, id)
	}
	if rec.Head == "" {
		return "", fmt.Errorf("%w: env %s has no committed state yet", state.ErrUnknownState, id)
	}
	return rec.Head, nil
}
