package manifest

import (
	"fmt"
	"strings"
	"time"

	"github.com/arbor-env/arbor/state"
)

// ArtifactKind says what an artifact is on disk.
type ArtifactKind string

// The artifact kinds.
const (
	ArtifactFS   ArtifactKind = "fs"   // a read-only filesystem snapshot name
	ArtifactProc ArtifactKind = "proc" // a CRIU image directory id
)

// Artifact is one checkpoint product that lives outside the database.
type Artifact struct {
	ID       string       `json:"id"`
	Kind     ArtifactKind `json:"kind"`
	Location string       `json:"location"` // snapshot name or image dir id
	Bytes    int64        `json:"bytes"`
	// Base is the process artifact a delta image reads its unchanged
	// pages from (cr/imgdelta; "" for a whole image): while an artifact
	// is in use, so is its base, and the base's own, and so on. Whole is
	// the image's size as CRIU dumped it, before it became a delta (0:
	// Bytes).
	Base    string    `json:"base,omitempty"`
	Whole   int64     `json:"whole,omitempty"`
	Created time.Time `json:"created"`
	// Ready is false while the artifact is being written (an intent record).
	Ready bool `json:"ready"`
}

// State is the sandbox state after one turn.
type State struct {
	ID     string     `json:"id"`
	Env    string     `json:"env"`
	Parent string     `json:"parent,omitempty"`
	Turn   int        `json:"turn"`
	Kind   state.Kind `json:"kind"`
	// FS is the id of the newest fs artifact describing this state.
	FS string `json:"fs,omitempty"`
	// Proc is the id of the newest process artifact describing this state;
	// a state whose processes did not change shares its parent's.
	Proc string `json:"proc,omitempty"`
	// ShellDelta is a shell delta state's script (inspector.ShellDelta):
	// the state is Proc's image with this run in its restored shell,
	// after which the shell's state digest must be ShellDigest. A
	// non-empty ShellDigest marks such a state (the script may be empty:
	// the shell went back to the image's state); a state of kind proc or
	// full with one wrote no image of its own, and a state of kind fs
	// inherits its parent's (docs/engine.md, "Shell delta states").
	ShellDelta  string                   `json:"shell_delta,omitempty"`
	ShellDigest string                   `json:"shell_digest,omitempty"`
	Created     time.Time                `json:"created"`
	Timings     map[string]time.Duration `json:"timings,omitempty"` // e.g. "freeze", "snapshot", "dump", "total"
	// Released means the owner no longer wants the state; GC may remove it
	// once no live state descends from it and its retention is over.
	Released bool `json:"released,omitempty"`
	// ClosedAt is when the env that made the state closed and released it:
	// its retention runs from then (Policy.Retain). It is zero for a state
	// released by name (Release), which has no retention, and in records
	// written before retention existed, which are read as such.
	ClosedAt time.Time `json:"closed_at,omitzero"`
	// Pinned keeps the state (and its ancestors) whatever else says, until
	// Unpin.
	Pinned bool `json:"pinned,omitempty"`
}

// Env is one sandbox's record: its image and current state, and what a
// restart needs to bring it back under the same id (docs/engine.md, "Crash
// safety").
type Env struct {
	ID      string    `json:"id"`
	Image   string    `json:"image"`
	Head    string    `json:"head,omitempty"`
	Created time.Time `json:"created"`
	Closed  bool      `json:"closed,omitempty"`
	// Origin is the env this one was branched from ("" for a fresh one).
	Origin string `json:"origin,omitempty"`
	// Labels are the owner's metadata (task, base turn, seed...), kept so
	// that it can adopt the env again after a restart.
	Labels map[string]string `json:"labels,omitempty"`
	// Lost says why a restart could not restore the env (MarkLost); a lost
	// env is closed but keeps its states until it is released.
	Lost string `json:"lost,omitempty"`
	// Imported marks the record of an env of another node, made when one
	// of its states was imported (ImportState).
	Imported bool `json:"imported,omitempty"`
}

// KindUsage is the count and summed size of ready artifacts of one kind.
type KindUsage struct {
	Count int   `json:"count"`
	Bytes int64 `json:"bytes"`
}

// Usage summarises what the manifest accounts for.
type Usage struct {
	Artifacts map[ArtifactKind]KindUsage `json:"artifacts"` // ready artifacts only
	Intents   int                        `json:"intents"`   // artifacts still being written
	States    int                        `json:"states"`
	Envs      int                        `json:"envs"`
}

// RecoverReport says what Recover found and removed.
type RecoverReport struct {
	// HalfWritten are the intents found; their records are gone and the
	// caller deletes whatever exists of them on disk.
	HalfWritten []Artifact
	// Missing are ready artifacts whose files no longer exist; their
	// records are gone.
	Missing []Artifact
	// RemovedStates are the states that referenced a missing artifact.
	RemovedStates []string
}

// checkID refuses ids that are empty or contain NUL, the separator of the
// env index keys.
func checkID(what, id string) error {
	if id == "" {
		return fmt.Errorf("empty %s id: %w", what, ErrInvalid)
	}
	if strings.IndexByte(id, 0) >= 0 {
		return fmt.Errorf("%s id %q contains NUL: %w", what, id, ErrInvalid)
	}
	return nil
}

func (a *Artifact) validate() error {
	if err := checkID("artifact", a.ID); err != nil {
		return err
	}
	if a.Kind != ArtifactFS && a.Kind != ArtifactProc {
		return fmt.Errorf("artifact kind %q: %w", a.Kind, ErrInvalid)
	}
	return nil
}

func (s *State) validate() error {
	if err := checkID("state", s.ID); err != nil {
		return err
	}
	if err := checkID("env", s.Env); err != nil {
		return err
	}
	if !s.Kind.Valid() {
		return fmt.Errorf("state kind %q: %w", s.Kind, ErrInvalid)
	}
	// A checkpoint that captured files must name them, and likewise for
	// processes; otherwise the pairing of newest artifacts is broken.
	if (s.Kind == state.FS || s.Kind == state.Full) && s.FS == "" {
		return fmt.Errorf("kind %s without fs artifact: %w", s.Kind, ErrInvalid)
	}
	if (s.Kind == state.Proc || s.Kind == state.Full) && s.Proc == "" {
		return fmt.Errorf("kind %s without proc artifact: %w", s.Kind, ErrInvalid)
	}
	if s.ShellDelta != "" && s.ShellDigest == "" {
		return fmt.Errorf("shell delta without digest: %w", ErrInvalid)
	}
	if s.ShellDigest != "" && s.Proc == "" {
		return fmt.Errorf("shell delta without the image it applies on: %w", ErrInvalid)
	}
	if s.Parent == s.ID {
		return fmt.Errorf("state is its own parent: %w", ErrInvalid)
	}
	return nil
}

// Dumped reports whether the state's checkpoint wrote a process image
// (kind proc or full, and not a shell delta).
func (s State) Dumped() bool {
	return (s.Kind == state.Proc || s.Kind == state.Full) && s.ShellDigest == ""
}

func (e *Env) validate() error {
	return checkID("env", e.ID)
}

func (a Artifact) recordID() string { return a.ID }
func (s State) recordID() string    { return s.ID }
func (e Env) recordID() string      { return e.ID }
