// Package server is Arbor's environment server: protocol v1 (see package
// protocol and docs/protocol.md) over a websocket at /v1/ws, in front of
// the checkpoint/restore engine (package branch) and the env pool, plus
// /livez, /readyz and /metrics.
//
// Requests on one connection run concurrently and are answered as they
// finish; operations on one env run one at a time in the order the server
// received them (a ticket chain per env), whatever connection they came
// on. Operations are detached from the connection that asked for them: a
// client that goes away mid-step leaves the step to finish and be
// checkpointed, and the env stays open (envs belong to the server, not to
// a connection) until it is closed or the pool's idle TTL reaps it.
//
// The coordinator's first cut lives here too: after each step the turn's
// checkpoint is queued in the background with the kind a Classifier
// chooses (full until the Inspector exists); the next operation on the env
// waits for it.
package server
