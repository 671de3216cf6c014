// Package agent is the tool set an agent (a model, not a trainer) uses on
// one Arbor environment: bash, read_file, write_file, list_states,
// rollback and fork_try. Every call that runs a command is a turn of the
// coordinator (package coordinator), checkpointed in the background by the
// same rule as a protocol step, and the package keeps its own log of
// (turn, state id, command) per environment so that list_states can tell
// the agent which command produced each state and rollback can say what it
// restored. fork_try runs a command on a throwaway branch of the
// environment and reports what it would have changed.
//
// The same tools are served over the Model Context Protocol (streamable
// HTTP, the official Go SDK) by Handler: /v1/mcp/{env_id} attaches to an
// open environment, /v1/mcp?task=NAME or ?image=NAME starts one for the
// session and closes it when the session ends. See docs/agent-tools.md.
package agent
