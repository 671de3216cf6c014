package server

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"sync"

	"github.com/arbor-env/arbor/server/protocol"
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
			return nil, protocol.Errorf(protocol.CodeBadRequest, "key %q was used for another action on env %s (a request key names one step)", key, env)
		}
		if e.res == nil {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "the step with key %q already ran on env %s (turn %d, state %s); its result is no longer kept",
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
	size := int64(len(res.Obs.Stdout)+len(res.Obs.Stderr)+len(key)) + 512
	k.mu.Lock()
	defer k.mu.Unlock()
	e := &keyed{env: env, key: key, action: actionSum(a), res: res, stateID: res.Info.StateID, turn: res.Info.Turn, size: size}
	list := k.envs[env]
	if len(list) >= k.perEnv {
		k.drop(list[0])
		list = k.envs[env]
	}
	k.envs[env] = append(list, e)
	e.inAll = k.all.PushBack(e)
	e.inBodies = k.bodies.PushBack(e)
	k.bytes += size
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
