package sandbox

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// Sentinel errors of the sandbox runtime; test with errors.Is.
var (
	// ErrUnsupported: the host lacks something a sandbox needs (cgroup v2
	// tree, namespaces, root).
	ErrUnsupported = state.New(state.ErrInfra, "sandbox runtime unsupported on this host")
	// ErrDead: the sandbox's init is gone; the sandbox cannot run commands.
	ErrDead = state.New(state.ErrInfra, "sandbox is dead")
	// ErrTimeout: the sandbox did not answer in time (not a command
	// timeout, which is reported in Result.TimedOut).
	ErrTimeout = state.New(state.ErrInfra, "sandbox did not answer in time")
	// ErrClosed: the sandbox was destroyed.
	ErrClosed = state.New(state.ErrInfra, "sandbox destroyed")
	// ErrBadCommand: the command was refused before it ran (too large).
	ErrBadCommand = state.New(state.ErrTooLarge, "command refused")
	// ErrIsolation: a sandbox's hardening is not what it must be (a
	// capability set beyond the policy, a restored child whose
	// capabilities, no_new_privs or seccomp differ from its dump); such a
	// sandbox is never handed out.
	ErrIsolation = errors.New("sandbox isolation check failed")
	// ErrImpostor: the control channel taken from the sandbox's init is
	// not a socket pair init made (package ctl). Nothing inside the
	// sandbox can bring that about, so it is the server's failure; the
	// sandbox is not driven.
	ErrImpostor = state.New(state.ErrInfra, "sandbox control channel not made by its init")
	// ErrBroken: a process inside the sandbox broke what the server needs
	// to drive or checkpoint it (removed the shell so that none can start
	// again, keeps a SIGTRAP pending), while init runs on. That is the agent's outcome, not a
	// failure of the server (docs/protocol.md, Errors: env_error).
	ErrBroken = state.New(state.ErrAgent, "sandbox broken from inside")
	// ErrUnshiftedRoot: user namespace mode was asked for on a root file
	// system not owned by the mapped id range.
	ErrUnshiftedRoot = errors.New("root file system not shifted to the user namespace range")
	// ErrBadRoot: the root file system has a shape the server refuses to
	// prepare (a symlink where it writes).
	ErrBadRoot = errors.New("root file system refused")
	// ErrBadConfig: a Config field is refused before anything is made
	// (the error names the field).
	ErrBadConfig = errors.New("sandbox config refused")
	// ErrUIDMap: a started or restored sandbox's init does not have the
	// uid/gid maps its mode asks for; the sandbox is not handed out.
	ErrUIDMap = errors.New("sandbox uid map does not match its mode")
)
