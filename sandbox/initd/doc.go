// Package initd is arbor-init, the process that runs as pid 1 and session
// leader inside every sandbox. Stage one (Setup) builds the sandbox's mount
// tree and pivots into the root; stage two (Run) owns the persistent shell on
// a pseudo-terminal and serves the control socket (see package ctl).
//
// Everything init holds lives inside the sandbox (its pty, its pipes, its
// listening socket), so a CRIU dump of the tree sees no descriptor that
// points outside it, and a restore into a different clone just works.
package initd
