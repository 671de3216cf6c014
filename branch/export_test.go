package branch

import "github.com/arbor-env/arbor/cr/manifest"

// SetCrashHook installs f as the hook every checkpoint calls at each phase
// of the crash-safety protocol (crashHook); tests only.
func SetCrashHook(f func(phase string, made []manifest.Artifact)) { crashHook = f }
