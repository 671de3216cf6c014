// Package envpool turns tasks into environments: it loads task files
// (image, setup, instruction, verifier), prepares each task once up to a
// post-setup checkpoint, keeps a warm pool of environments restored from it
// so that reset does not pay for setup, and runs verifiers on throwaway
// forks. What happens to an environment once handed out (turns, branches,
// idle TTL, close) is the coordinator's (package coordinator). Booting a
// sandbox from an image is package launch's job.
package envpool
