package manifest

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// PutEnv creates or replaces an env record. A non-empty Head must name an
// existing state; Created defaults to now (or the stored value on replace).
func (m *Manifest) PutEnv(e Env) error {
	if err := e.validate(); err != nil {
		return fmt.Errorf("put env %s: %w", e.ID, err)
	}
	err := m.db.Update(func(tx *bolt.Tx) error {
		if e.Head != "" && tx.Bucket(bucketStates).Get([]byte(e.Head)) == nil {
			return fmt.Errorf("head state %s: %w", e.Head, ErrNotFound)
		}
		if e.Created.IsZero() {
			e.Created = time.Now()
			if old, err := get[Env](tx, bucketEnvs, "env", e.ID); err == nil {
				e.Created = old.Created
			}
		}
		return put(tx, bucketEnvs, e)
	})
	if err != nil {
		return fmt.Errorf("put env %s: %w", e.ID, err)
	}
	return nil
}

// GetEnv returns the env record id.
func (m *Manifest) GetEnv(id string) (Env, error) { return getOne[Env](m, bucketEnvs, "env", id) }

// Envs returns every env record, closed ones included, by id.
func (m *Manifest) Envs() ([]Env, error) { return listAll[Env](m, bucketEnvs, "envs") }

// SetHead points an open env at an existing state (a rollback).
func (m *Manifest) SetHead(env, state string) error {
	err := m.updateEnv(env, func(tx *bolt.Tx, e *Env) error {
		if e.Closed {
			return ErrClosed
		}
		if tx.Bucket(bucketStates).Get([]byte(state)) == nil {
			return fmt.Errorf("state %s: %w", state, ErrNotFound)
		}
		e.Head = state
		return nil
	})
	if err != nil {
		return fmt.Errorf("set head of env %s to %s: %w", env, state, err)
	}
	return nil
}

// SetLabels merges labels into an open env's labels (MergeLabels).
func (m *Manifest) SetLabels(env string, labels map[string]string) error {
	for k := range labels {
		if k == "" {
			return fmt.Errorf("set labels of env %s: empty label key: %w", env, ErrInvalid)
		}
	}
	err := m.updateEnv(env, func(_ *bolt.Tx, e *Env) error {
		if e.Closed {
			return ErrClosed
		}
		e.Labels = MergeLabels(e.Labels, labels)
		return nil
	})
	if err != nil {
		return fmt.Errorf("set labels of env %s: %w", env, err)
	}
	return nil
}

// MergeLabels sets labels' keys in into (made if nil) and returns it; a
// key with an empty value is removed.
func MergeLabels(into, labels map[string]string) map[string]string {
	if into == nil {
		into = map[string]string{}
	}
	for k, v := range labels {
		if v == "" {
			delete(into, k)
		} else {
			into[k] = v
		}
	}
	return into
}

// MarkLost closes an env that a restart could not restore and records
// why, so that later runs still report it; its states stay until
// ReleaseEnvAt.
func (m *Manifest) MarkLost(id, reason string) error {
	err := m.updateEnv(id, func(_ *bolt.Tx, e *Env) error {
		e.Closed, e.Lost = true, reason
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark env %s lost: %w", id, err)
	}
	return nil
}

// updateEnv changes env record id with f in one transaction; nothing is
// written when f fails.
func (m *Manifest) updateEnv(id string, f func(*bolt.Tx, *Env) error) error {
	return m.db.Update(func(tx *bolt.Tx) error {
		e, err := get[Env](tx, bucketEnvs, "env", id)
		if err != nil {
			return err
		}
		if err := f(tx, &e); err != nil {
			return err
		}
		return put(tx, bucketEnvs, e)
	})
}

// CloseEnv marks an env closed: no more states are committed to it and
// its head no longer keeps states alive. Its states stay until released.
func (m *Manifest) CloseEnv(id string) error {
	err := m.db.Update(func(tx *bolt.Tx) error { return closeEnv(tx, id) })
	if err != nil {
		return fmt.Errorf("close env %s: %w", id, err)
	}
	return nil
}

func closeEnv(tx *bolt.Tx, id string) error {
	e, err := get[Env](tx, bucketEnvs, "env", id)
	if err != nil {
		return err
	}
	if e.Closed {
		return nil
	}
	e.Closed = true
	return put(tx, bucketEnvs, e)
}

// ReleaseEnvAt releases every state of env and closes it, in one
// transaction; a lost env is no longer reported lost. The states it
// releases get at as their ClosedAt: their retention starts then (states
// released by name before keep none). States that branch children
// descend from stay alive.
func (m *Manifest) ReleaseEnvAt(id string, at time.Time) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		if err := closeEnv(tx, id); err != nil {
			return err
		}
		if e, err := get[Env](tx, bucketEnvs, "env", id); err == nil && e.Lost != "" {
			e.Lost = ""
			if err := put(tx, bucketEnvs, e); err != nil {
				return err
			}
		}
		for _, sid := range envStateIDs(tx, id) {
			if err := closeRelease(tx, sid, at); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("release env %s: %w", id, err)
	}
	return nil
}

// ReleaseClosedAt releases, in one transaction, every unreleased state of
// the closed envs that are not lost, as ReleaseEnvAt at at would have: an
// engine that closed envs without releasing them (a graceful Close or
// NoRecover, before they released) left their lineages kept for ever. It
// reports how many states it released.
func (m *Manifest) ReleaseClosedAt(at time.Time) (int, error) {
	n := 0
	err := m.db.Update(func(tx *bolt.Tx) error {
		n = 0
		es, err := all[Env](tx, bucketEnvs)
		if err != nil {
			return err
		}
		for _, e := range es {
			if !e.Closed || e.Lost != "" {
				continue
			}
			for _, sid := range envStateIDs(tx, e.ID) {
				s, err := get[State](tx, bucketStates, "state", sid)
				if err != nil {
					return err
				}
				if s.Released {
					continue
				}
				if err := closeRelease(tx, sid, at); err != nil {
					return err
				}
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("release closed envs: %w", err)
	}
	return n, nil
}
