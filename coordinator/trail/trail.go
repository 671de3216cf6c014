// Package trail is the durable record of how each state came to be: the
// turns (action, observation, timings) between a state's parent and the
// state, and the verifier's verdicts on states. The coordinator writes it
// as turns end; protocol trajectory reads it back along a state's lineage
// (docs/protocol.md, "trajectory"), so a trainer gets a path's actions and
// observations from the server after its own process died.
//
// It is a bbolt database of msgpack records (msgpack keeps command output
// byte for byte, valid UTF-8 or not) in a file of its own beside the
// engine's manifest: the engine's records say which states exist, these
// say what the agent did between them. Records are keyed by state id and
// go when their state does (Sweep). It makes no system calls of its own
// beyond bbolt's, so it can be tested anywhere.
//
// A Store is safe for concurrent use.
package trail

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrLocked: another opener holds the file.
var ErrLocked = errors.New("trail database is locked by another opener")

var (
	bucketSegments = []byte("segments") // state id -> Segment
	bucketVerdicts = []byte("verdicts") // state id -> Verdict
)

// Action is a turn's action as the client sent it (protocol v1's step
// action); Cmd and Content are cut at the store's cap (Cut).
type Action struct {
	Tool      string  `msgpack:"tool"`
	Cmd       string  `msgpack:"cmd,omitempty"`
	TimeoutS  float64 `msgpack:"timeout_s,omitempty"`
	Path      string  `msgpack:"path,omitempty"`
	Content   []byte  `msgpack:"content,omitempty"`
	StateID   string  `msgpack:"state_id,omitempty"`
	MaxOutput int     `msgpack:"max_output,omitempty"`
	// Cut: Cmd or Content was longer than the store keeps.
	Cut bool `msgpack:"cut,omitempty"`
}

// Obs is what a turn observed, as the step returned it; Stdout and
// Stderr are cut at the store's cap (Cut), keeping head and tail.
type Obs struct {
	Stdout    string  `msgpack:"stdout"`
	Stderr    string  `msgpack:"stderr"`
	ExitCode  int     `msgpack:"exit_code"`
	TimedOut  bool    `msgpack:"timed_out,omitempty"`
	Truncated bool    `msgpack:"truncated,omitempty"` // the step cut its output
	Cwd       string  `msgpack:"cwd,omitempty"`
	DurationS float64 `msgpack:"duration_s"` // the command's run time
	// StdoutBytes and StderrBytes are the sizes before any cap.
	StdoutBytes    int64    `msgpack:"stdout_bytes,omitempty"`
	StderrBytes    int64    `msgpack:"stderr_bytes,omitempty"`
	ShellRestarted bool     `msgpack:"shell_restarted,omitempty"`
	Limits         []string `msgpack:"limits,omitempty"`
	// Cut: the store kept less of Stdout or Stderr than the step returned.
	Cut bool `msgpack:"cut,omitempty"`
}

// Turn is one turn of an episode.
type Turn struct {
	Turn   int    `msgpack:"turn"`   // since the episode began
	Env    string `msgpack:"env"`    // the env that ran it
	State  string `msgpack:"state"`  // the state after it
	Parent string `msgpack:"parent"` // the state before it (State when it took no checkpoint)
	Kind   string `msgpack:"kind"`   // what its checkpoint captured: none, fs, proc, full
	Action Action `msgpack:"action"`
	Obs    Obs    `msgpack:"obs"`
	// Started is when the step began; StepS how long the whole turn took
	// (command, classification, queueing the checkpoint).
	Started time.Time `msgpack:"started"`
	StepS   float64   `msgpack:"step_s"`
}

// Segment is the turns that led from Parent to a state, oldest first:
// the turn that made the state last, after the turns that took no
// checkpoint (kind none) since Parent. A state made without a turn (a
// forced checkpoint) has only those.
type Segment struct {
	Parent string `msgpack:"parent"`
	Turns  []Turn `msgpack:"turns"`
	// Start marks the state an episode began at (a reset): a trajectory
	// starts there, whatever made its ancestors (a task's setup).
	Start bool `msgpack:"start,omitempty"`
}

// Verdict is what the task's verifier said of a state.
type Verdict struct {
	Reward  float64        `msgpack:"reward"`
	Details map[string]any `msgpack:"details,omitempty"`
	At      time.Time      `msgpack:"at"`
}

// Store is an open trail database.
type Store struct {
	db *bolt.DB
}

// Open opens (creating) the trail database at path. It fails with
// ErrLocked when another opener holds it for longer than a second.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open trail %s: %w", path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open trail %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSegments, bucketVerdicts} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open trail %s: create buckets: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close trail: %w", err)
	}
	return nil
}

// Path is the database file's path.
func (s *Store) Path() string { return s.db.Path() }

func (s *Store) put(bucket []byte, state string, v any) error {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s of %s: %w", bucket, state, err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(state), b) }); err != nil {
		return fmt.Errorf("write %s of %s: %w", bucket, state, err)
	}
	return nil
}

func (s *Store) get(bucket []byte, state string, v any) (bool, error) {
	var raw []byte
	_ = s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucket).Get([]byte(state)); b != nil {
			raw = append([]byte(nil), b...)
		}
		return nil
	})
	if raw == nil {
		return false, nil
	}
	if err := msgpack.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("decode %s of %s: %w", bucket, state, err)
	}
	return true, nil
}

// PutSegment records the turns that led to state.
func (s *Store) PutSegment(state string, seg Segment) error {
	return s.put(bucketSegments, state, seg)
}

// Segment returns the turns that led to state (false: none recorded).
func (s *Store) Segment(state string) (Segment, bool, error) {
	var seg Segment
	ok, err := s.get(bucketSegments, state, &seg)
	return seg, ok, err
}

// PutVerdict records the verifier's verdict on state (the newest wins).
func (s *Store) PutVerdict(state string, v Verdict) error {
	return s.put(bucketVerdicts, state, v)
}

// Verdict returns the newest verdict on state (false: none recorded).
func (s *Store) Verdict(state string) (Verdict, bool, error) {
	var v Verdict
	ok, err := s.get(bucketVerdicts, state, &v)
	return v, ok, err
}

// Sweep deletes the records of every state keep says is gone, and
// returns how many it deleted. keep is called without a transaction
// open, so it may be slow; a state id is never reused, so a state found
// gone stays gone.
func (s *Store) Sweep(keep func(state string) bool) (int, error) {
	type key struct {
		bucket []byte
		state  string
	}
	var all []key
	err := s.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSegments, bucketVerdicts} {
			if err := tx.Bucket(b).ForEach(func(k, _ []byte) error {
				all = append(all, key{b, string(k)})
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep trail: %w", err)
	}
	gone := map[string]bool{}
	var doomed []key
	for _, k := range all {
		g, seen := gone[k.state]
		if !seen {
			g = !keep(k.state)
			gone[k.state] = g
		}
		if g {
			doomed = append(doomed, k)
		}
	}
	if len(doomed) == 0 {
		return 0, nil
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		for _, k := range doomed {
			if err := tx.Bucket(k.bucket).Delete([]byte(k.state)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep trail: %w", err)
	}
	return len(doomed), nil
}

// Cut keeps at most max bytes of s (max > 0): its head and tail, with a
// one-line marker between them saying how many bytes were dropped, as
// the sandbox caps a command's output. It reports whether it cut.
func Cut[T string | []byte](s T, max int) (T, bool) {
	if max <= 0 || len(s) <= max {
		return s, false
	}
	marker := fmt.Sprintf("\n[... arbor: %d bytes omitted ...]\n", len(s)-max)
	head := max / 2
	tail := max - head
	out := make([]byte, 0, max+len(marker))
	out = append(out, s[:head]...)
	out = append(out, marker...)
	out = append(out, s[len(s)-tail:]...)
	return T(out), true
}
