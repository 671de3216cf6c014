// Package ctl is the control protocol between the Arbor server and the init
// process (arbor-init) that runs as pid 1 inside every sandbox: one JSON
// object per line over a unix stream connection, except that the raw bytes
// of an output piece follow its line (see Response.More).
//
// No connection is reached through a path. Init's stage one makes a unix
// stream socket pair and keeps both ends, on descriptors ChannelFD and
// ServerEndFD: nothing in the sandbox's file tree or namespaces leads to
// them. The server takes a copy of ServerEndFD from init's descriptor table
// (pidfd_getfd) and, for each connection, makes a socket pair of its own
// and sends one end to init over that channel (SCM_RIGHTS, one byte per
// connection); init serves it. Both ends of the channel belong to init, so
// a CRIU dump archives the pair like any other inside the tree and a
// restored init has it back on the same descriptors. A connection's own
// pair has its server end outside the sandbox: the server closes its
// connection before a dump (OpDetach) and connects again afterwards.
package ctl

import "time"

// ChannelFD is the descriptor of init (stage two) on which it receives the
// server's connections: its end of the channel pair.
const ChannelFD = 100

// ServerEndFD is the descriptor of init that holds the channel pair's other
// end. Init never uses it; it keeps it so the server can take a copy from
// init's descriptor table, at start and after every restore.
const ServerEndFD = 101

// The descriptors on which the managed shell holds init's channels: the
// command socket, the stdout and stderr pipes of commands and the status
// socket (sandbox/initd). They are the harness's, not the agent's: the
// Inspector does not count them as state the shell holds.
const (
	ShellCmdFD    = 196
	ShellOutFD    = 197
	ShellErrFD    = 198
	ShellStatusFD = 199
)

// Dir is the sandbox-internal directory Arbor owns (the init binary).
const Dir = "/.arbor"

// InitPath is where the init binary is placed inside the sandbox root.
const InitPath = "/.arbor/init"

// Ops a Request can carry.
const (
	OpExec = "exec" // run one command in the persistent shell
	// OpRun runs a script as a fresh child of init, outside the persistent
	// shell: /bin/sh -c Cmd with the environment Env, in Dir, in a session
	// of its own, with stdin /dev/null and stdout and stderr on pipes
	// only init reads. The verifier runs this way, so nothing the agent
	// defined in its shell (functions, aliases, traps) applies to it.
	OpRun   = "run"
	OpPing  = "ping"  // liveness; returns shell pid
	OpShell = "shell" // describe the shell (pid, path)
	// OpDetach asks init to close this connection; the server waits for
	// the end of the stream, so that at a dump init holds no socket whose
	// peer is outside the sandbox.
	OpDetach = "detach"
)

// Request is one line sent by the server.
type Request struct {
	Op string `json:"op"`
	// Cmd is the command text; it runs in the persistent shell itself, so
	// cd, variables, functions and aliases persist.
	Cmd string `json:"cmd,omitempty"`
	// Timeout bounds the command; zero means DefaultTimeout.
	Timeout time.Duration `json:"timeout,omitempty"`
	// MaxOutput caps each of stdout and stderr; zero means
	// DefaultMaxOutput. The server caps output itself (init streams it,
	// see Response.More); an init that predates streaming caps it here.
	MaxOutput int `json:"max_output,omitempty"`
	// Env ("KEY=VALUE") is the whole environment of an OpRun child; init
	// adds PATH and HOME when it lacks them.
	Env []string `json:"env,omitempty"`
	// Dir is an OpRun child's working directory ("/" when empty).
	Dir string `json:"dir,omitempty"`
	// Shell is how the persistent shell starts, for OpShell only: the
	// server sends it with its first request to a started init, before
	// any command. Init starts its first shell at the first request it
	// gets (with this config, or the default when the first request
	// carries none) and uses the same config for every shell that
	// replaces it. Once a shell has started, a different config is
	// refused (Response.Error); an equal one, or none, changes nothing.
	Shell *Shell `json:"shell,omitempty"`
}

// Response is the answer to one Request.
//
// Init sends a command's output as it reads it, in pieces before the
// answer: a Response with More set, Stream and Chunk, whose line is
// followed by Chunk raw bytes of that stream. Init keeps none of it, so
// output costs the sandbox's memory a few pieces in flight whatever its
// size; the server keeps what it caps (sandbox.MaxOutputCeiling). The
// answer itself (More unset) has no Stdout or Stderr from a current init;
// one that predates streaming sends them there, capped by MaxOutput.
type Response struct {
	// More marks an output piece: Chunk bytes (at most MaxChunk) of
	// stream Stream (StreamStdout or StreamStderr) follow the line.
	More   bool `json:"more,omitempty"`
	Stream int  `json:"stream,omitempty"`
	Chunk  int  `json:"chunk,omitempty"`

	// Error is set when init could not do what was asked (not when the
	// command failed: that is ExitCode).
	Error string `json:"error,omitempty"`

	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	// StdoutBytes and StderrBytes count what the command wrote.
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Truncated   bool   `json:"truncated,omitempty"`
	ExitCode    int    `json:"exit_code"`
	Cwd         string `json:"cwd,omitempty"`
	TimedOut    bool   `json:"timed_out,omitempty"`
	// Duration is the command's wall time inside the sandbox.
	Duration time.Duration `json:"duration"`
	// ShellExited is set when the command ended the shell (e.g. `exit`);
	// init started a fresh one, whose state is empty.
	ShellExited bool `json:"shell_exited,omitempty"`

	ShellPID  int    `json:"shell_pid,omitempty"`
	ShellPath string `json:"shell_path,omitempty"`
	// ShellRestarts counts the shells init had to replace, and LastExit
	// says how the last one ended ("exit status 3", "signal: killed").
	ShellRestarts int    `json:"shell_restarts,omitempty"`
	LastExit      string `json:"last_exit,omitempty"`
	// ShellError is set while the shell is dead because init could not
	// start a new one: why the last try failed (init tries again,
	// backing off).
	ShellError string `json:"shell_error,omitempty"`
	// Rejected counts what init dropped from the status channel while
	// this command ran (bytes from processes other than the shell and
	// records without the command's nonce and sequence number): a sign
	// that something in the sandbox tried to forge a result.
	Rejected int `json:"rejected,omitempty"`
}

// Defaults applied by init when a Request leaves a field zero.
const (
	DefaultTimeout   = 60 * time.Second
	DefaultMaxOutput = 256 << 10
	// MaxCommand bounds the command text.
	MaxCommand = 1 << 20
)

// The streams of an output piece (Response.Stream).
const (
	StreamStdout = 1
	StreamStderr = 2
)

// MaxChunk bounds the bytes of one output piece.
const MaxChunk = 64 << 10
