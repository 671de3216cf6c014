package manifest

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// graph is every state and env, read in one transaction.
type graph struct {
	states map[string]State
	envs   []Env
}

func loadGraph(tx *bolt.Tx) (graph, error) {
	ss, err := all[State](tx, bucketStates)
	if err != nil {
		return graph{}, err
	}
	es, err := all[Env](tx, bucketEnvs)
	if err != nil {
		return graph{}, err
	}
	g := graph{states: make(map[string]State, len(ss)), envs: es}
	for _, s := range ss {
		g.states[s.ID] = s
	}
	return g, nil
}

// live marks the states some owner still needs: unreleased states, heads
// of open envs, and every ancestor of those. An ancestor of a head is kept
// too, so an open env's lineage never has holes GC made.
func (g graph) live() map[string]bool {
	live := map[string]bool{}
	mark := func(id string) {
		for id != "" && !live[id] {
			s, ok := g.states[id]
			if !ok {
				return
			}
			live[id] = true
			id = s.Parent
		}
	}
	for id, s := range g.states {
		if !s.Released {
			mark(id)
		}
	}
	for _, e := range g.envs {
		if !e.Closed {
			mark(e.Head)
		}
	}
	return live
}

// Garbage returns the states no owner needs any more (released, not the
// head of an open env, not an ancestor of a live state) and the ready
// artifacts no remaining state references, both in id order. Intents are
// never garbage: they are checkpoints in progress.
func (m *Manifest) Garbage() (states []State, artifacts []Artifact, err error) {
	err = m.db.View(func(tx *bolt.Tx) error {
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		live := g.live()
		used := map[string]bool{}
		for id, s := range g.states {
			if live[id] {
				used[s.FS] = true
				used[s.Proc] = true
			}
		}
		// Iterate the bucket, not the map, for id order.
		err = tx.Bucket(bucketStates).ForEach(func(k, _ []byte) error {
			if !live[string(k)] {
				states = append(states, g.states[string(k)])
			}
			return nil
		})
		if err != nil {
			return err
		}
		as, err := all[Artifact](tx, bucketArtifacts)
		if err != nil {
			return err
		}
		for _, a := range as {
			if a.Ready && !used[a.ID] {
				artifacts = append(artifacts, a)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("collect garbage: %w", err)
	}
	return states, artifacts, nil
}

// Forget deletes state and artifact records in one transaction, after the
// caller deleted the artifacts' files. It re-checks what Garbage promised
// and refuses with ErrInUse, deleting nothing, if a listed state became
// live or a listed artifact is an intent or is referenced by a state that
// stays. Ids already gone are skipped, so a retry is harmless.
func (m *Manifest) Forget(stateIDs, artifactIDs []string) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		live := g.live()
		gone := map[string]bool{}
		for _, id := range stateIDs {
			s, ok := g.states[id]
			if !ok {
				continue
			}
			if live[id] {
				return fmt.Errorf("state %s is live: %w", id, ErrInUse)
			}
			gone[id] = true
			if err := deleteState(tx, s); err != nil {
				return err
			}
		}
		refs := map[string]string{}
		for id, s := range g.states {
			if !gone[id] {
				refs[s.FS] = id
				refs[s.Proc] = id
			}
		}
		for _, id := range artifactIDs {
			v := tx.Bucket(bucketArtifacts).Get([]byte(id))
			if v == nil {
				continue
			}
			a, err := decode[Artifact]([]byte(id), v)
			if err != nil {
				return err
			}
			if !a.Ready {
				return fmt.Errorf("artifact %s is an intent: %w", id, ErrInUse)
			}
			if by, ok := refs[id]; ok {
				return fmt.Errorf("artifact %s referenced by state %s: %w", id, by, ErrInUse)
			}
			if err := tx.Bucket(bucketArtifacts).Delete([]byte(id)); err != nil {
				return fmt.Errorf("delete artifact %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("forget %d states, %d artifacts: %w", len(stateIDs), len(artifactIDs), err)
	}
	return nil
}
