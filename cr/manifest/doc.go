// Package manifest is Arbor's durable record of checkpoint states: for each
// state id, its env, parent, turn, checkpoint kind, and the newest
// filesystem artifact and newest process artifact that describe it. It is a
// bbolt database of JSON records and makes no system calls of its own, so it
// can be tested and fuzzed anywhere.
//
// # Crash-safety protocol
//
// An artifact (a read-only snapshot, a CRIU image directory) lives outside
// the database, so creating it and recording it cannot be one atomic step.
// The manifest orders the two so that a crash at any moment leaves
// something Recover can classify:
//
//  1. BeginArtifact writes an intent record (Ready=false) before the caller
//     creates anything on disk. A crash after this point leaves an intent,
//     never an artifact nobody knows about.
//  2. The caller creates the artifact (snapshot, dump).
//  3. CommitState, in one transaction, marks the new artifacts Ready,
//     inserts the state (refusing it if it names an artifact that is
//     missing or not ready), and moves the env's head to it. Either all of
//     this is on disk (bbolt fsyncs every commit) or none of it is.
//  4. At start-up, Recover reports every intent as half-written (the
//     caller deletes whatever exists of it) and drops its record; reports
//     every ready artifact whose files have vanished (Options.Exists) and
//     removes the states that reference one, moving env heads back to the
//     nearest surviving ancestor. Nothing else is touched: envs stay open,
//     with their heads (the last committed state) and the owner's labels
//     (SetLabels), so the engine can bring each back under its id.
//
// A failed checkpoint is undone with AbortArtifact after its files are
// deleted. Garbage collection runs the other way round: Collect lists what
// no live lineage needs, the caller deletes the files, then ForgetWith drops
// the records; a crash in between leaves ready records whose files are gone,
// which Recover reports as missing.
//
// # Liveness
//
// A state is live if it is not released, or pinned (Pin), or released by
// its env's close less than Policy.Retain ago (ClosedAt), or the head of an
// open env, or named by the caller (Policy.Keep), or an ancestor (via
// Parent, across envs) of a live state; so a branch child keeps the states
// it was forked from. Everything else is garbage, and so is every ready
// artifact no live state references. Collect lists garbage in bounded
// batches (Policy.MaxStates, MaxArtifacts) and ForgetWith re-checks it
// under the same policy (docs/engine.md, "Retention").
//
// A Manifest is safe for concurrent use. The database file is locked
// against a second opener, in this or another process.
package manifest
