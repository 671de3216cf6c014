// Package panics keeps a panic in the handler of one request from ending
// the server: the goroutine that serves the request recovers it, logs it
// with its stack, and the request is answered with an error (protocol
// code internal); every other request and connection goes on
// (docs/security.md, "A panic in one request").
//
// Every goroutine that serves a request, or a part of one, runs its work
// under Recover, Call or Handler. recover only stops a panic of its own
// goroutine, so a goroutine a handler starts needs its own.
package panics
