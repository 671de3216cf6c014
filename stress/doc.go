// Package stress drives a real `arbor serve` (bin/arbor, started as a
// subprocess on a state dir of its own) with many concurrent protocol v1
// clients, abrupt disconnects, slow readers, bad input and sandboxes
// killed from the host, and checks what docs/protocol.md promises under
// that load: every request is answered, an error is infra only where a
// fault was injected, no lie (every step sees the state it should), no env
// left frozen, and nothing leaks (mounts, cgroups, processes, fds,
// goroutines). It has only tests and benchmarks: TestStress (bounded, in
// make test; make stress runs it for 15 minutes and writes a report),
// TestLoad (agent loops with think time at 16 envs in make test; make load
// runs 64, 128 and 256 and writes benchmarks/results/load.md) and
// BenchmarkLatency / BenchmarkSlowReaderRSS.
//
// It speaks only the protocol (clients/go, server/protocol and raw
// websocket frames), so the server's internals can change freely.
package stress
