package manifest

import (
	"fmt"
	"log/slog"

	bolt "go.etcd.io/bbolt"
)

// brokenChains adds to missing every ready delta image (Artifact.Base)
// whose chain is not sound (chainFault): it cannot be restored any more
// than its base.
func brokenChains(as []Artifact, missing map[string]bool) {
	arts := byID(as)
	for _, a := range as {
		if a.Ready && a.Base != "" && !missing[a.ID] && chainFault(a, arts, missing) != "" {
			missing[a.ID] = true
		}
	}
}

// Recover restores the manifest's invariants after a crash; run it at
// start-up before anything begins a checkpoint, since every intent it sees
// is taken for half-written. It removes intents (reported HalfWritten: the
// caller deletes what exists of them), ready artifacts for which
// Options.Exists is false and the delta images whose chain has such a
// link (reported Missing; the caller deletes what exists of them), the states that reference a
// missing artifact (RemovedStates), and moves env heads off removed states
// to their nearest surviving ancestor (or to no head). Nothing else is
// touched. Running it twice in a row reports nothing the second time.
func (m *Manifest) Recover() (RecoverReport, error) {
	var rep RecoverReport
	// Ask Exists outside any transaction: it is the caller's code and may
	// be slow or call back into the manifest.
	missing := map[string]bool{}
	if m.exists != nil {
		as, err := m.Artifacts()
		if err != nil {
			return rep, fmt.Errorf("recover manifest: %w", err)
		}
		for _, a := range as {
			if a.Ready && !m.exists(a) {
				missing[a.ID] = true
			}
		}
		brokenChains(as, missing)
	}
	err := m.db.Update(func(tx *bolt.Tx) error {
		rep = RecoverReport{}
		as, err := all[Artifact](tx, bucketArtifacts)
		if err != nil {
			return err
		}
		present := map[string]bool{}
		for _, a := range as {
			switch {
			case !a.Ready:
				rep.HalfWritten = append(rep.HalfWritten, a)
			case missing[a.ID]:
				rep.Missing = append(rep.Missing, a)
			default:
				present[a.ID] = true
				continue
			}
			if err := tx.Bucket(bucketArtifacts).Delete([]byte(a.ID)); err != nil {
				return fmt.Errorf("delete artifact %s: %w", a.ID, err)
			}
		}
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		removed := map[string]bool{}
		// Bucket order keeps the report deterministic.
		err = tx.Bucket(bucketStates).ForEach(func(k, _ []byte) error {
			s := g.states[string(k)]
			if (s.FS == "" || present[s.FS]) && (s.Proc == "" || present[s.Proc]) {
				return nil
			}
			removed[s.ID] = true
			rep.RemovedStates = append(rep.RemovedStates, s.ID)
			return nil
		})
		if err != nil {
			return err
		}
		for id := range removed {
			if err := deleteState(tx, g.states[id]); err != nil {
				return err
			}
		}
		for _, e := range g.envs {
			if !removed[e.Head] {
				continue
			}
			head := e.Head
			for head != "" && removed[head] {
				head = g.states[head].Parent
			}
			if _, ok := g.states[head]; !ok {
				head = ""
			}
			m.log.Warn("manifest: moved env head", slog.String("env", e.ID),
				slog.String("from", e.Head), slog.String("to", head))
			e.Head = head
			if err := put(tx, bucketEnvs, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return RecoverReport{}, fmt.Errorf("recover manifest: %w", err)
	}
	for _, a := range rep.HalfWritten {
		m.log.Warn("manifest: half-written artifact", slog.String("artifact", a.ID),
			slog.String("kind", string(a.Kind)), slog.String("location", a.Location))
	}
	for _, a := range rep.Missing {
		m.log.Warn("manifest: missing artifact", slog.String("artifact", a.ID),
			slog.String("kind", string(a.Kind)), slog.String("location", a.Location))
	}
	for _, id := range rep.RemovedStates {
		m.log.Warn("manifest: removed state", slog.String("state", id))
	}
	return rep, nil
}
