package server

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// stepKeys records the results of keyed steps so that a retry (the same
// env, the same key) answers the recorded result instead of running the
// action again (docs/protocol.md, "Idempotent steps"). Memory is bounded
// three ways: the last perEnv keys of each env, at most maxKeys keys in
// all (the oldest go first), and maxBytes of recorded results: past it
// the oldest results are dropped and only their keys are kept, so that a
// retry of one is refused rather than run twice. Lookups and records run
// under the env's ticket, so a retry queued behind the step it repeats
// sees that step's record.
type stepKeys struct {
	perEnv, maxKeys int
	maxBytes        int64

	mu     sync.Mutex
	envs   map[string][]*keyed // oldest first
	all    *list.List          // every *keyed, oldest first
	bodies *list.List          // the *keyed that still hold a result, oldest first
	bytes  int64
}

type keyed struct {
	env, key string
	action   [sha256.Size]byte    // actionSum of the step's action
	res      *protocol.StepResult // nil once dropped for maxBytes
	stateID  string
	turn     int
	size     int64
	inAll    *list.Element
	inBodies *list.Element
}

func newStepKeys(perEnv, maxKeys int, maxBytes int64) *stepKeys {
	return &stepKeys{perEnv: perEnv, maxKeys: maxKeys, maxBytes: maxBytes,
		envs: map[string][]*keyed{}, all: list.New(), bodies: list.New()}
}

// lookup returns the recorded result of env's step with key (marked
// replayed), or nil when there is none. A key recorded for another
// action, or whose result was dropped, is an error.
func (k *stepKeys) lookup(env, key string, a protocol.Action) (*protocol.StepResult, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.envs[env] {
		if e.key != key {
			continue
		}
		if e.action != actionSum(a) {
			return nil, state.Errorf(state.ErrInvalid, "key %q was used for another action on env %s (a request key names one step)", key, env)
		}
		if e.res == nil {
			return nil, state.Errorf(state.ErrInvalid, "the step with key %q already ran on env %s (turn %d, state %s); its result is no longer kept",
				key, env, e.turn, e.stateID)
		}
		r := *e.res
		r.Info.Replayed = true
		return &r, nil
	}
	return nil, nil
}

// record keeps res as the result of env's step with key.
func (k *stepKeys) record(env, key string, a protocol.Action, res *protocol.StepResult) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.add(&keyed{env: env, key: key, action: actionSum(a), res: res, stateID: res.Info.StateID, turn: res.Info.Turn})
}

// keyRecord is one step key of an env as it travels with the env to
// another node (docs/cluster.md, "Live migration"): without its result
// when that was dropped, so that a retry there is refused, not run.
type keyRecord struct {
	Key     string               `msgpack:"key"`
	Action  []byte               `msgpack:"action"`
	Result  *protocol.StepResult `msgpack:"result,omitempty"`
	StateID string               `msgpack:"state_id"`
	Turn    int                  `msgpack:"turn"`
}

// export returns env's keys, oldest first, with the results of the
// newest that fit in maxBytes.
func (k *stepKeys) export(env string, maxBytes int64) []keyRecord {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.envs[env]
	out := make([]keyRecord, len(l))
	for i := len(l) - 1; i >= 0; i-- {
		e := l[i]
		out[i] = keyRecord{Key: e.key, Action: e.action[:], StateID: e.stateID, Turn: e.turn}
		if e.res != nil && e.size <= maxBytes {
			out[i].Result, maxBytes = e.res, maxBytes-e.size
		}
	}
	return out
}

// replace makes recs env's keys (export's records, oldest first).
func (k *stepKeys) replace(env string, recs []keyRecord) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range append([]*keyed(nil), k.envs[env]...) {
		k.drop(e)
	}
	for _, r := range recs {
		e := &keyed{env: env, key: r.Key, res: r.Result, stateID: r.StateID, turn: r.Turn}
		if copy(e.action[:], r.Action) != sha256.Size || r.Key == "" {
			return fmt.Errorf("step key %q of env %s: malformed record", r.Key, env)
		}
		k.add(e)
	}
	return nil
}

// add records e; k.mu is held.
func (k *stepKeys) add(e *keyed) {
	if e.res != nil {
		e.size = int64(len(e.res.Obs.Stdout)+len(e.res.Obs.Stderr)+len(e.key)) + 512
	}
	env := e.env
	list := k.envs[env]
	if len(list) >= k.perEnv {
		k.drop(list[0])
		list = k.envs[env]
	}
	k.envs[env] = append(list, e)
	e.inAll = k.all.PushBack(e)
	if e.res != nil {
		e.inBodies = k.bodies.PushBack(e)
		k.bytes += e.size
	}
	for k.all.Len() > k.maxKeys {
		k.drop(k.all.Front().Value.(*keyed))
	}
	for k.bytes > k.maxBytes && k.bodies.Len() > 0 {
		k.dropBody(k.bodies.Front().Value.(*keyed))
	}
}

// forget drops the keys of an env that is gone.
func (k *stepKeys) forget(env string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range append([]*keyed(nil), k.envs[env]...) {
		k.drop(e)
	}
}

// len reports the keys and the recorded bytes held (tests).
func (k *stepKeys) len() (keys int, bytes int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.all.Len(), k.bytes
}

func (k *stepKeys) dropBody(e *keyed) {
	if e.inBodies == nil {
		return
	}
	k.bodies.Remove(e.inBodies)
	e.inBodies, e.res = nil, nil
	k.bytes -= e.size
}

func (k *stepKeys) drop(e *keyed) {
	k.dropBody(e)
	k.all.Remove(e.inAll)
	l := k.envs[e.env]
	for i, x := range l {
		if x == e {
			l = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(k.envs, e.env)
	} else {
		k.envs[e.env] = l
	}
}

// actionSum identifies an action: every field, each length-prefixed.
func actionSum(a protocol.Action) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put([]byte(a.Tool))
	put([]byte(a.Cmd))
	put([]byte(a.Path))
	put(a.Content)
	put([]byte(a.StateID))
	binary.LittleEndian.PutUint64(n[:], math.Float64bits(a.TimeoutS))
	h.Write(n[:])
	binary.LittleEndian.PutUint64(n[:], uint64(a.MaxOutput))
	h.Write(n[:])
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// MigratedKeyBytes bounds the recorded results that travel with an env
// to another node: past it the oldest go without (a retry of one there
// is refused, as here once its result was dropped).
const MigratedKeyBytes = 8 << 20

// ExportStepKeys returns env's step keys, encoded, for its migration to
// another node (cluster.StepKeys); call it under the env's ticket.
func (s *Server) ExportStepKeys(env string) ([]byte, error) {
	return msgpack.Marshal(s.keys.export(env, MigratedKeyBytes))
}

// ImportStepKeys makes keys (ExportStepKeys' encoding; nil: none) env's
// step keys here, as its migration from another node brought them: a
// retry of a keyed step that ran there answers its result here.
func (s *Server) ImportStepKeys(env string, keys []byte) error {
	var recs []keyRecord
	if len(keys) > 0 {
		if err := msgpack.Unmarshal(keys, &recs); err != nil {
			return fmt.Errorf("step keys of env %s: %w", env, err)
		}
	}
	return s.keys.replace(env, recs)
}
