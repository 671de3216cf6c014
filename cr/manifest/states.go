package manifest

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// CommitState, in one transaction, marks the artifacts named in ready as
// Ready, inserts s, and makes it the head of its env. It refuses (and
// writes nothing) if s's id exists (ErrExists), its env or parent does not
// exist (ErrNotFound), its env is closed (ErrClosed), or s.FS or s.Proc
// names an artifact that is missing or still not ready (ErrNotFound).
// Created defaults to now.
func (m *Manifest) CommitState(s State, ready ...string) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("commit state %s: %w", s.ID, err)
	}
	if s.Created.IsZero() {
		s.Created = time.Now()
	}
	err := m.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketStates).Get([]byte(s.ID)) != nil {
			return ErrExists
		}
		e, err := get[Env](tx, bucketEnvs, "env", s.Env)
		if err != nil {
			return err
		}
		if e.Closed {
			return ErrClosed
		}
		if s.Parent != "" && tx.Bucket(bucketStates).Get([]byte(s.Parent)) == nil {
			return fmt.Errorf("parent state %s: %w", s.Parent, ErrNotFound)
		}
		if err := insertState(tx, s, ready); err != nil {
			return err
		}
		e.Head = s.ID
		return put(tx, bucketEnvs, e)
	})
	if err != nil {
		return fmt.Errorf("commit state %s: %w", s.ID, err)
	}
	return nil
}

// insertState marks the artifacts named in ready as Ready and inserts s,
// whose artifacts must exist and be ready, with its index by env.
func insertState(tx *bolt.Tx, s State, ready []string) error {
	if err := markReady(tx, ready); err != nil {
		return err
	}
	if err := checkRefs(tx, s); err != nil {
		return err
	}
	if err := put(tx, bucketStates, s); err != nil {
		return err
	}
	if err := tx.Bucket(bucketByEnv).Put(byEnvKey(s.Env, s.ID), nil); err != nil {
		return fmt.Errorf("index state: %w", err)
	}
	return nil
}

// GetState returns the state record id.
func (m *Manifest) GetState(id string) (State, error) {
	return getOne[State](m, bucketStates, "state", id)
}

// States returns the states committed to env, by turn, then creation time,
// then id.
func (m *Manifest) States(env string) ([]State, error) {
	var ss []State
	err := m.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketEnvs).Get([]byte(env)) == nil {
			return fmt.Errorf("env %s: %w", env, ErrNotFound)
		}
		for _, id := range envStateIDs(tx, env) {
			s, err := get[State](tx, bucketStates, "state", id)
			if err != nil {
				return err
			}
			ss = append(ss, s)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list states of env %s: %w", env, err)
	}
	slices.SortFunc(ss, func(a, b State) int {
		return cmp.Or(cmp.Compare(a.Turn, b.Turn), a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	return ss, nil
}

// Lineage returns the state id and its ancestors via Parent, root first.
// Parents may lie in other envs (a branch). If Recover removed an
// ancestor, the lineage starts at the oldest one that survives.
func (m *Manifest) Lineage(id string) ([]State, error) {
	var line []State
	err := m.db.View(func(tx *bolt.Tx) error {
		s, err := get[State](tx, bucketStates, "state", id)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for {
			if seen[s.ID] {
				return fmt.Errorf("parent cycle at state %s: %w", s.ID, ErrCorrupt)
			}
			seen[s.ID] = true
			line = append(line, s)
			if s.Parent == "" || tx.Bucket(bucketStates).Get([]byte(s.Parent)) == nil {
				break
			}
			if s, err = get[State](tx, bucketStates, "state", s.Parent); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lineage of state %s: %w", id, err)
	}
	slices.Reverse(line)
	return line, nil
}

// Release marks states as no longer wanted by their owner, in one
// transaction: all of them or, when one does not exist (ErrNotFound),
// none. A released state has no retention, even one its env's close
// released before (that retention ends). It stays while it is pinned, an
// env's open head or an ancestor of a live state.
func (m *Manifest) Release(ids ...string) error {
	err := m.updateStates(ids, func(s *State) {
		s.Released, s.ClosedAt = true, time.Time{}
	})
	if err != nil {
		return fmt.Errorf("release states %v: %w", ids, err)
	}
	return nil
}

// Pin keeps states (and their ancestors) until Unpin, whatever releases
// them; all of them or, when one does not exist (ErrNotFound), none.
func (m *Manifest) Pin(ids ...string) error {
	err := m.updateStates(ids, func(s *State) { s.Pinned = true })
	if err != nil {
		return fmt.Errorf("pin states %v: %w", ids, err)
	}
	return nil
}

// Unpin undoes Pin: each state is kept again only as far as the rest of
// the policy says (released, retained, live). All or none, as Pin.
func (m *Manifest) Unpin(ids ...string) error {
	err := m.updateStates(ids, func(s *State) { s.Pinned = false })
	if err != nil {
		return fmt.Errorf("unpin states %v: %w", ids, err)
	}
	return nil
}

// updateStates changes the states ids with f in one transaction; nothing
// is written when one of them does not exist.
func (m *Manifest) updateStates(ids []string, f func(*State)) error {
	return m.db.Update(func(tx *bolt.Tx) error {
		for _, id := range ids {
			s, err := get[State](tx, bucketStates, "state", id)
			if err != nil {
				return err
			}
			before := s
			f(&s)
			if s.Released == before.Released && s.Pinned == before.Pinned && s.ClosedAt.Equal(before.ClosedAt) {
				continue
			}
			if err := put(tx, bucketStates, s); err != nil {
				return err
			}
		}
		return nil
	})
}

// closeRelease releases state id as its env's close does: with the
// retention that starts at at. A state released before keeps its own
// standing.
func closeRelease(tx *bolt.Tx, id string, at time.Time) error {
	s, err := get[State](tx, bucketStates, "state", id)
	if err != nil {
		return err
	}
	if s.Released {
		return nil
	}
	s.Released, s.ClosedAt = true, at
	return put(tx, bucketStates, s)
}
