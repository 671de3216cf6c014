package manifest

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Policy is what garbage collection keeps besides the lineages of open
// envs and unreleased states (docs/engine.md, "Retention").
type Policy struct {
	// Now is the time retention is measured at (zero: time.Now()).
	Now time.Time
	// Retain is how long a state released by its env's close (ClosedAt)
	// is kept; 0 keeps it no longer than something needs it.
	Retain time.Duration
	// Keep are more states to keep with their ancestors: references the
	// caller holds outside the manifest (a branch in flight, warm copies).
	// Ids that do not exist are ignored.
	Keep []string
	// MaxStates and MaxArtifacts bound what one Collect returns (0: no
	// bound), so that one pass of garbage collection does bounded work.
	MaxStates, MaxArtifacts int
	// Evict is the policy under disk pressure: the retention of closed
	// lineages is ignored (Retain keeps nothing), so their states are
	// garbage unless pinned, an open env's lineage or kept by Keep.
	// Collect then lists the states that are garbage anyway first, then
	// the retained ones by the time their env closed, oldest first
	// (docs/engine.md, "Disk pressure").
	Evict bool
	// MaxBytes bounds one Collect by the room it frees (nil: no bound):
	// it lists states, in its order, only until for every kind in the map
	// the artifacts of that kind they alone use (no live state uses them,
	// each counted once) sum to at least its bound (kind "": artifacts of
	// every kind), so that eviction deletes what brings a file system
	// under its low mark, not a whole batch more. Artifacts sized 0 (no
	// quotas) never reach a bound.
	MaxBytes map[ArtifactKind]int64
}

func (p Policy) now() time.Time {
	if p.Now.IsZero() {
		return time.Now()
	}
	return p.Now
}

// retained reports whether p keeps s for itself (not for a descendant),
// and until when it does so by retention alone (zero: no end, or none).
func (p Policy) retained(s State, now time.Time) (bool, time.Time) {
	switch {
	case !s.Released, s.Pinned:
		return true, time.Time{}
	case s.ClosedAt.IsZero() || p.Retain <= 0 || p.Evict:
		return false, time.Time{}
	}
	until := s.ClosedAt.Add(p.Retain)
	if now.Before(until) {
		return true, until
	}
	return false, time.Time{}
}

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

// live marks the states some owner still needs under p: unreleased and
// pinned states, released ones still in their retention, heads of open
// envs, p.Keep, and every ancestor of those. An ancestor is kept too, so
// an open env's lineage never has holes GC made. next is the earliest end
// of a retention that keeps a state now (zero: none).
func (g graph) live(p Policy) (live map[string]bool, next time.Time) {
	live = map[string]bool{}
	now := p.now()
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
		keep, until := p.retained(s, now)
		if !keep {
			continue
		}
		mark(id)
		if !until.IsZero() && (next.IsZero() || until.Before(next)) {
			next = until
		}
	}
	for _, e := range g.envs {
		if !e.Closed {
			mark(e.Head)
		}
	}
	for _, id := range p.Keep {
		mark(id)
	}
	return live, next
}

// Garbage is what Collect found.
type Garbage struct {
	// States no owner needs, oldest first, and Artifacts no state needs
	// once they are gone (ready ones only), in id order.
	States    []State
	Artifacts []Artifact
	// More says that the bounds of the policy left garbage out.
	More bool
	// Next is the earliest time a retention now in force ends (zero:
	// none), when more may become garbage without any other change.
	Next time.Time
}

// Collect returns what p does not keep: the states no owner needs
// (released, out of their retention, not pinned, not the head of an open
// env, not an ancestor of a live state), oldest first, and the ready
// artifacts no remaining state references, both within p's bounds.
// Intents are never garbage: they are checkpoints in progress.
func (m *Manifest) Collect(p Policy) (Garbage, error) {
	var out Garbage
	err := m.db.View(func(tx *bolt.Tx) error {
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		live, next := g.live(p)
		out.Next = next
		now := p.now()
		var dead []State
		for id, s := range g.states {
			if !live[id] {
				dead = append(dead, s)
			}
		}
		// Under Evict, a state only the ignored retention would keep
		// sorts after every other garbage, by its close, oldest first.
		retainedAt := func(s State) time.Time {
			if !p.Evict {
				return time.Time{}
			}
			if keep, _ := (Policy{Retain: p.Retain}).retained(s, now); keep {
				return s.ClosedAt
			}
			return time.Time{}
		}
		slices.SortFunc(dead, func(a, b State) int {
			return cmp.Or(retainedAt(a).Compare(retainedAt(b)), a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
		})
		as, err := all[Artifact](tx, bucketArtifacts)
		if err != nil {
			return err
		}
		if n := g.byteBound(p.MaxBytes, live, dead, as); n < len(dead) {
			dead, out.More = dead[:n], true
		}
		if p.MaxStates > 0 && len(dead) > p.MaxStates {
			dead, out.More = dead[:p.MaxStates], true
		}
		gone := make(map[string]bool, len(dead))
		for _, s := range dead {
			gone[s.ID] = true
		}
		arts := byID(as)
		used := map[string]bool{}
		for id, s := range g.states {
			if !gone[id] {
				used[s.FS] = true
				used[s.Proc] = true
			}
		}
		withBases(used, arts)
		out.States = dead
		for _, a := range as {
			if !a.Ready || used[a.ID] {
				continue
			}
			if p.MaxArtifacts > 0 && len(out.Artifacts) == p.MaxArtifacts {
				out.More = true
				break
			}
			out.Artifacts = append(out.Artifacts, a)
		}
		return nil
	})
	if err != nil {
		return Garbage{}, fmt.Errorf("collect garbage: %w", err)
	}
	return out, nil
}

// byID indexes artifacts by id.
func byID(as []Artifact) map[string]Artifact {
	m := make(map[string]Artifact, len(as))
	for _, a := range as {
		m[a.ID] = a
	}
	return m
}

// withBases adds to uses (artifact id -> what uses it) the bases of the
// artifacts in it, and theirs, each used by what uses its delta: the one
// rule that keeps a delta image's chain (Artifact.Base) as long as the
// delta.
func withBases[V any](uses map[string]V, arts map[string]Artifact) {
	for id, by := range uses {
		for b := arts[id].Base; b != ""; b = arts[b].Base {
			if _, ok := uses[b]; ok {
				break
			}
			uses[b] = by
		}
	}
}

// chainFault says what is wrong with the chain of bases of delta image a
// (Artifact.Base), "" when nothing is: a link without a record, in
// missing (may be nil), not ready or not a process image, or a loop. The
// one rule for a sound chain, which Check reports and Recover drops.
func chainFault(a Artifact, arts map[string]Artifact, missing map[string]bool) string {
	seen := map[string]bool{a.ID: true}
	for b := a.Base; b != ""; b = arts[b].Base {
		ba, ok := arts[b]
		switch {
		case !ok || missing[b]:
			return fmt.Sprintf("base %s missing", b)
		case !ba.Ready:
			return fmt.Sprintf("base %s not ready", b)
		case ba.Kind != ArtifactProc:
			return fmt.Sprintf("base %s is a %s artifact, not a process image", b, ba.Kind)
		case seen[b]:
			return fmt.Sprintf("base cycle at %s", b)
		}
		seen[b] = true
	}
	return ""
}

// byteBound is how many states of dead (in order) Collect lists under
// the bounds of max (Policy.MaxBytes): the shortest prefix whose
// artifacts no live state uses reach every bound, or all of dead.
func (g graph) byteBound(max map[ArtifactKind]int64, live map[string]bool, dead []State, as []Artifact) int {
	if len(max) == 0 {
		return len(dead)
	}
	liveUses := map[string]bool{}
	for id := range live {
		s := g.states[id]
		liveUses[s.FS], liveUses[s.Proc] = true, true
	}
	arts := byID(as)
	withBases(liveUses, arts)
	sum := map[ArtifactKind]int64{}
	counted := map[string]bool{}
	reached := func() bool {
		for k, b := range max {
			if sum[k] < b {
				return false
			}
		}
		return true
	}
	for i, s := range dead {
		for _, id := range []string{s.FS, s.Proc} {
			if a, ok := arts[id]; ok && id != "" && !liveUses[id] && !counted[id] {
				counted[id] = true
				sum[a.Kind] += a.Bytes
				sum[""] += a.Bytes
			}
		}
		if reached() {
			return i + 1
		}
	}
	return len(dead)
}

// Garbage returns everything Collect finds with no retention, no bounds
// and no outside references, states in id order.
func (m *Manifest) Garbage() (states []State, artifacts []Artifact, err error) {
	g, err := m.Collect(Policy{})
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(g.States, func(a, b State) int { return cmp.Compare(a.ID, b.ID) })
	return g.States, g.Artifacts, nil
}

// ForgetWith deletes state and artifact records in one transaction, after
// the caller deleted the artifacts' files. It re-checks what Collect
// promised under p and refuses with ErrInUse, deleting nothing, if a
// listed state became live or a listed artifact is an intent or is
// referenced by a state that stays. Ids already gone are skipped, so a
// retry is harmless.
func (m *Manifest) ForgetWith(p Policy, stateIDs, artifactIDs []string) error {
	err := m.db.Update(func(tx *bolt.Tx) error {
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		live, _ := g.live(p)
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
		as, err := all[Artifact](tx, bucketArtifacts)
		if err != nil {
			return err
		}
		refs := map[string]string{}
		for id, s := range g.states {
			if !gone[id] {
				refs[s.FS] = id
				refs[s.Proc] = id
			}
		}
		withBases(refs, byID(as))
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

// ForgetEnvs deletes, in one transaction, at most max (0: no bound) env
// records nothing needs any more: closed, not lost, without a state left
// (GC removed them all), and named as origin by no env that stays. An
// origin goes with or after the envs branched from it, never before, so
// no remaining record names one that is gone. It returns the ids deleted
// and whether the bound left some over. It looks first in a read
// transaction, so that a GC pass with no such env writes nothing.
func (m *Manifest) ForgetEnvs(max int) (ids []string, more bool, err error) {
	err = m.db.View(func(tx *bolt.Tx) error {
		ids, more, err = envGarbage(tx, max)
		return err
	})
	if err == nil && len(ids) > 0 {
		err = m.db.Update(func(tx *bolt.Tx) error {
			ids, more, err = envGarbage(tx, max)
			if err != nil {
				return err
			}
			for _, id := range ids {
				if err := tx.Bucket(bucketEnvs).Delete([]byte(id)); err != nil {
					return fmt.Errorf("delete env %s: %w", id, err)
				}
			}
			return nil
		})
	}
	if err != nil {
		return nil, false, fmt.Errorf("forget envs: %w", err)
	}
	return ids, more, nil
}

// envGarbage lists the env records ForgetEnvs deletes, in the order it
// may: an env only after every env naming it as origin (es is in id
// order, so the pick is stable), at most max of them.
func envGarbage(tx *bolt.Tx, max int) (ids []string, more bool, err error) {
	es, err := all[Env](tx, bucketEnvs)
	if err != nil {
		return nil, false, err
	}
	garbage := map[string]bool{}
	for _, e := range es {
		if e.Closed && e.Lost == "" && len(envStateIDs(tx, e.ID)) == 0 {
			garbage[e.ID] = true
		}
	}
	// An env that stays keeps its origin, and that one its own.
	origin := make(map[string]string, len(es))
	for _, e := range es {
		origin[e.ID] = e.Origin
	}
	for _, e := range es {
		if garbage[e.ID] {
			continue
		}
		for o := e.Origin; garbage[o]; o = origin[o] {
			delete(garbage, o)
		}
	}
	referrers := map[string]int{}
	for _, e := range es {
		if garbage[e.ID] && e.Origin != "" {
			referrers[e.Origin]++
		}
	}
	for progress := true; progress; {
		progress = false
		for _, e := range es {
			if !garbage[e.ID] || referrers[e.ID] > 0 {
				continue
			}
			if max > 0 && len(ids) == max {
				return ids, true, nil
			}
			delete(garbage, e.ID)
			ids = append(ids, e.ID)
			if e.Origin != "" {
				referrers[e.Origin]--
			}
			progress = true
		}
	}
	return ids, false, nil
}
