// Package protocol is Arbor's wire protocol v1: msgpack-rpc frames carried
// one per binary websocket message, the error codes, and the typed params
// and results of every method. It is pure logic (no I/O), shared by the
// server and the Go client, and fuzzed (FuzzDecodeFrame).
//
// docs/protocol.md is its reference for people and other languages.
package protocol
