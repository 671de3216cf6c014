// Package seccomp compiles the seccomp filter of hardened sandboxes
// (docs/sandbox.md, "Isolation"): Docker's default profile, taken as data
// from github.com/moby/profiles/seccomp and filtered for the capabilities
// the sandbox keeps as Docker does, plus Arbor's own rule (ioctl TIOCSTI
// and TIOCLINUX denied: they would let a process type into the persistent
// shell's terminal), compiled with libseccomp to a classic-BPF program.
//
// The server compiles (cgo); arbor-init is static and only loads the
// program it is handed (sandbox/initd). Programs are cached per distinct
// capability set.
package seccomp
