package manifest

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BeginArtifact records the intent to create a, before the caller creates
// anything on disk; the record stays not ready until CommitState names it.
// Created defaults to now.
func (m *Manifest) BeginArtifact(a Artifact) error {
	if err := a.validate(); err != nil {
		return fmt.Errorf("begin artifact %s: %w", a.ID, err)
	}
	a.Ready = false
	if a.Created.IsZero() {
		a.Created = time.Now()
	}
	err := m.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketArtifacts).Get([]byte(a.ID)) != nil {
			return ErrExists
		}
		return put(tx, bucketArtifacts, a)
	})
	if err != nil {
		return fmt.Errorf("begin artifact %s: %w", a.ID, err)
	}
	return nil
}

// SetArtifactBytes records an artifact's size, known only once it is
// written; it works on intents and ready artifacts alike.
func (m *Manifest) SetArtifactBytes(id string, n int64) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		a, err := get[Artifact](tx, bucketArtifacts, "artifact", id)
		if err != nil {
			return err
		}
		a.Bytes = n
		return put(tx, bucketArtifacts, a)
	})
	if err != nil {
		return fmt.Errorf("set artifact bytes %s: %w", id, err)
	}
	return nil
}

// SetArtifactDelta records that process artifact id, once written, became
// a delta image of base (Artifact.Base) holding n bytes of its whole
// bytes; it works on intents only, before CommitState names them.
func (m *Manifest) SetArtifactDelta(id, base string, n, whole int64) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		a, err := getIntent(tx, id)
		if err != nil {
			return err
		}
		b, err := get[Artifact](tx, bucketArtifacts, "artifact", base)
		if err != nil {
			return fmt.Errorf("base: %w", err)
		}
		if !b.Ready || b.Kind != ArtifactProc || a.Kind != ArtifactProc {
			return fmt.Errorf("base %s (%s, ready %v) of %s artifact: want a ready process artifact of a process artifact", base, b.Kind, b.Ready, a.Kind)
		}
		a.Bytes, a.Base, a.Whole = n, base, whole
		return put(tx, bucketArtifacts, a)
	})
	if err != nil {
		return fmt.Errorf("set artifact delta %s: %w", id, err)
	}
	return nil
}

// getIntent reads artifact id, refusing it with ErrInUse once it is
// ready: what only an intent allows (its delta record, an abort).
func getIntent(tx *bolt.Tx, id string) (Artifact, error) {
	a, err := get[Artifact](tx, bucketArtifacts, "artifact", id)
	if err == nil && a.Ready {
		err = fmt.Errorf("artifact is ready: %w", ErrInUse)
	}
	return a, err
}

// AbortArtifact removes an intent whose checkpoint failed; the caller
// deletes its files first. An artifact already committed is refused with
// ErrInUse: those leave through Garbage and ForgetWith.
func (m *Manifest) AbortArtifact(id string) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		if _, err := getIntent(tx, id); err != nil {
			return err
		}
		return tx.Bucket(bucketArtifacts).Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("abort artifact %s: %w", id, err)
	}
	return nil
}

// GetArtifact returns the artifact record id.
func (m *Manifest) GetArtifact(id string) (Artifact, error) {
	return getOne[Artifact](m, bucketArtifacts, "artifact", id)
}

// Artifacts returns every artifact record, intents included, by id.
func (m *Manifest) Artifacts() ([]Artifact, error) {
	return listAll[Artifact](m, bucketArtifacts, "artifacts")
}

// Usage counts artifacts by kind with their summed sizes, intents, states
// and envs.
func (m *Manifest) Usage() (Usage, error) {
	u := Usage{Artifacts: map[ArtifactKind]KindUsage{}}
	err := m.db.View(func(tx *bolt.Tx) error {
		as, err := all[Artifact](tx, bucketArtifacts)
		if err != nil {
			return err
		}
		for _, a := range as {
			if !a.Ready {
				u.Intents++
				continue
			}
			k := u.Artifacts[a.Kind]
			k.Count++
			k.Bytes += a.Bytes
			u.Artifacts[a.Kind] = k
		}
		u.States = tx.Bucket(bucketStates).Stats().KeyN
		u.Envs = tx.Bucket(bucketEnvs).Stats().KeyN
		return nil
	})
	if err != nil {
		return Usage{}, fmt.Errorf("compute usage: %w", err)
	}
	return u, nil
}
