package manifest

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ImportState records s, a state another node's manifest committed and
// whose artifacts were just written here (docs/cluster.md, "State
// transfer"), in one transaction: the artifacts named in ready become
// Ready, s is inserted released with its retention starting at at (it
// stays branchable by id for the retention, then GC collects it), and
// its env gets a closed record from env (its image, origin and labels,
// marked Imported) when it has none (an env of another node; an
// existing record is left as it is, its head too). Its
// parent need not exist here. It refuses, writing nothing, a state that
// exists (ErrExists) or whose artifacts are missing or not ready.
func (m *Manifest) ImportState(env Env, s State, at time.Time, ready ...string) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("import state %s: %w", s.ID, err)
	}
	if env.ID != s.Env {
		return fmt.Errorf("import state %s: env %s, the state names %s: %w", s.ID, env.ID, s.Env, ErrInvalid)
	}
	s.Released, s.ClosedAt, s.Pinned = true, at, false
	err := m.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketStates).Get([]byte(s.ID)) != nil {
			return ErrExists
		}
		if tx.Bucket(bucketEnvs).Get([]byte(env.ID)) == nil {
			env.Closed, env.Head, env.Lost, env.Imported = true, "", "", true
			if env.Created.IsZero() {
				env.Created = at
			}
			if err := put(tx, bucketEnvs, env); err != nil {
				return err
			}
		}
		return insertState(tx, s, ready)
	})
	if err != nil {
		return fmt.Errorf("import state %s: %w", s.ID, err)
	}
	return nil
}

// ReopenEnv makes env id open again at head (a state of it, or of the
// env it was branched from when it made none yet) with labels, and takes
// back the release of every state of it, in one transaction: an env
// whose lineage was imported from another node and that now lives here
// (a migration).
func (m *Manifest) ReopenEnv(id, head string, labels map[string]string) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		e, err := get[Env](tx, bucketEnvs, "env", id)
		if err != nil {
			return err
		}
		st, err := get[State](tx, bucketStates, "state", head)
		if err != nil {
			return err
		}
		_ = st // a branch child that made no state yet has its origin's
		e.Closed, e.Head, e.Lost, e.Labels = false, head, "", MergeLabels(nil, labels)
		if err := put(tx, bucketEnvs, e); err != nil {
			return err
		}
		for _, sid := range envStateIDs(tx, id) {
			s, err := get[State](tx, bucketStates, "state", sid)
			if err != nil {
				return err
			}
			if !s.Released {
				continue
			}
			s.Released, s.ClosedAt = false, time.Time{}
			if err := put(tx, bucketStates, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reopen env %s: %w", id, err)
	}
	return nil
}

// markReady marks the artifacts ids Ready.
func markReady(tx *bolt.Tx, ids []string) error {
	for _, id := range ids {
		a, err := get[Artifact](tx, bucketArtifacts, "artifact", id)
		if err != nil {
			return err
		}
		if !a.Ready {
			a.Ready = true
			if err := put(tx, bucketArtifacts, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRefs checks that s's artifacts exist, are ready and of their kind.
func checkRefs(tx *bolt.Tx, s State) error {
	for _, ref := range []struct {
		id   string
		kind ArtifactKind
	}{{s.FS, ArtifactFS}, {s.Proc, ArtifactProc}} {
		if ref.id == "" {
			continue
		}
		a, err := get[Artifact](tx, bucketArtifacts, string(ref.kind)+" artifact", ref.id)
		if err != nil {
			return err
		}
		if !a.Ready {
			return fmt.Errorf("%s artifact %s not ready: %w", ref.kind, ref.id, ErrNotFound)
		}
		if a.Kind != ref.kind {
			return fmt.Errorf("%s artifact %s is of kind %s: %w", ref.kind, ref.id, a.Kind, ErrInvalid)
		}
	}
	return nil
}
