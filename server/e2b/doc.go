// Package e2b serves the API of E2B's SDK (docs/e2b.md) on Arbor's
// listener: the sandbox lifecycle REST API (create, list, get, kill,
// timeout, pause, resume, fork) and the in-sandbox daemon's API the SDK
// reaches on the same port with the E2b-Sandbox-Id header (the Connect
// services process.Process and filesystem.Filesystem in their JSON form,
// and the files upload and download routes).
//
// It is an adapter over package coordinator, its only door to the engine:
// an E2B sandbox is an env handed out to the request's tenant, a command
// is a turn (coordinator.Turn, so it is classified and checkpointed; its
// state id rides in the Arbor-State-Id trailer, which the SDK ignores), a
// fork is a branch. Errors are state's sentinels, turned into the HTTP
// statuses and Connect codes the SDK maps to its error classes in one
// place (errors.go).
//
// Locks: API.mu guards the sandboxes' records and the running commands;
// it is a leaf, never held across a call into the coordinator.
package e2b
