// Package launch boots environments: a sandbox on a fresh writable clone
// of an image. It sits below branch, which checkpoints and restores
// environments, and envpool, which keeps warm pools of them per task
// (docs/architecture.md).
package launch
