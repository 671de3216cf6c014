// Package server is Arbor's environment server: protocol v1 (see package
// protocol and docs/protocol.md) over a websocket at /v1/ws, the OpenEnv
// endpoint at /openenv/TASK/ (openenv.go, docs/openenv.md; proxied to the
// nodes by a router, openenv_proxy.go), plus /livez, /readyz and
// /metrics. It is an adapter: it speaks the protocol (frames,
// auth, limits, params) and hands every operation to the coordinator
// (package coordinator), its only way to the engine, which owns the turn
// and the envs; errors get their codes from protocol.ErrorOf.
//
// Requests on one connection run concurrently and are answered as they
// finish; operations on one env run one at a time in the order the server
// received them (the coordinator's ticket chain per env), whatever
// connection they came on. Operations are detached from the connection
// that asked for them: a client that goes away mid-step leaves the step
// to finish and be checkpointed, and the env stays open (envs belong to
// the coordinator, not to a connection) until it is closed or the idle
// TTL reaps it.
package server
