// Package envpool makes environments: a sandbox booted on a fresh writable
// clone of an image. Later it keeps warm pools of them per task.
package envpool
