package manifest

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Check verifies the manifest's invariants in one read transaction and
// returns every violation found, joined (nil: consistent): each record
// decodes; each state names an env that exists, has its index entry, and
// references ready artifacts of the right kind; each delta image's chain
// of bases holds ready process images, without a loop; each index entry names a
// state of that env; an open env's head exists; no parent chain loops.
// A state's parent may be missing (GC deletes ancestors no one needs).
// The soak tests run it after their load (docs/engine.md, "Disk pressure").
func (m *Manifest) Check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	err := m.db.View(func(tx *bolt.Tx) error {
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		as, err := all[Artifact](tx, bucketArtifacts)
		if err != nil {
			return err
		}
		arts := byID(as)
		for _, a := range as {
			if a.Ready && a.Base != "" {
				if f := chainFault(a, arts, nil); f != "" {
					bad("artifact %s: %s", a.ID, f)
				}
			}
		}
		envs := make(map[string]Env, len(g.envs))
		for _, e := range g.envs {
			envs[e.ID] = e
		}
		for id, s := range g.states {
			if _, ok := envs[s.Env]; !ok {
				bad("state %s: env %s missing", id, s.Env)
			}
			if tx.Bucket(bucketByEnv).Get(byEnvKey(s.Env, id)) == nil {
				bad("state %s: no index entry under env %s", id, s.Env)
			}
			for _, ref := range []struct {
				id   string
				kind ArtifactKind
			}{{s.FS, ArtifactFS}, {s.Proc, ArtifactProc}} {
				if ref.id == "" {
					continue
				}
				a, ok := arts[ref.id]
				switch {
				case !ok:
					bad("state %s: %s artifact %s missing", id, ref.kind, ref.id)
				case !a.Ready:
					bad("state %s: %s artifact %s not ready", id, ref.kind, ref.id)
				case a.Kind != ref.kind:
					bad("state %s: artifact %s is %s, want %s", id, ref.id, a.Kind, ref.kind)
				}
			}
			seen := map[string]bool{}
			for p := id; p != ""; p = g.states[p].Parent {
				if seen[p] {
					bad("state %s: parent cycle at %s", id, p)
					break
				}
				seen[p] = true
				if _, ok := g.states[p]; !ok {
					break
				}
			}
		}
		err = tx.Bucket(bucketByEnv).ForEach(func(k, _ []byte) error {
			env, sid, ok := cutKey(k)
			if s, found := g.states[sid]; !ok || !found || s.Env != env {
				bad("index entry %q names no state of its env", k)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range g.envs {
			if _, ok := g.states[e.Head]; !e.Closed && e.Head != "" && !ok {
				bad("open env %s: head %s missing", e.ID, e.Head)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check manifest: %w", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("check manifest: %w: %w", ErrCorrupt, errors.Join(errs...))
	}
	return nil
}

// cutKey splits an index key into env and state id.
func cutKey(k []byte) (env, state string, ok bool) {
	for i, b := range k {
		if b == 0 {
			return string(k[:i]), string(k[i+1:]), true
		}
	}
	return "", "", false
}
