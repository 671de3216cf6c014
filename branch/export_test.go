package branch

import (
	"context"
	"time"

	"github.com/arbor-env/arbor/cr/queue"

	"github.com/arbor-env/arbor/cr/manifest"
)

// SetCrashHook installs f as the hook every checkpoint calls at each phase
// of the crash-safety protocol (crashHook); tests only.
func SetCrashHook(f func(phase string, made []manifest.Artifact)) { crashHook = f }

// AdvanceClock moves the clock e measures retention with d ahead and
// wakes its GC; tests only.
func AdvanceClock(e *Engine, d time.Duration) {
	e.clockOff.Add(int64(d))
	e.nudgeGC()
}

// NudgeGC wakes e's background GC for a pass; tests only.
func NudgeGC(e *Engine) { e.nudgeGC() }

// Held reports whether a pending branch holds state sid from GC; tests
// only.
func Held(e *Engine, sid string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.refs[sid] > 0
}

// SetStatfs makes e measure its watched file systems with f (name is
// DiskPool, DiskCold or DiskHot); tests only.
func SetStatfs(e *Engine, f func(name, path string) (used, total, free int64, err error)) {
	e.pr.mu.Lock()
	e.pr.statfs = f
	e.pr.statfsGen++
	e.pr.mu.Unlock()
	e.nudgeGC()
}

// SetStatfsMax bounds e's statfs calls by d instead of statfsMax; tests
// only.
func SetStatfsMax(e *Engine, d time.Duration) {
	e.pr.mu.Lock()
	e.pr.statfsMax = d
	e.pr.mu.Unlock()
}

// ArtifactBytes is the size the manifest records for artifact id; tests
// only.
func ArtifactBytes(e *Engine, id string) (int64, error) {
	a, err := e.man.GetArtifact(id)
	return a.Bytes, err
}

// HoldQueue occupies a worker of e's queue with a high-priority job until
// release is called (with Options.Workers 1, nothing else runs
// meanwhile); tests only.
func HoldQueue(e *Engine) (release func()) {
	started, done := make(chan struct{}), make(chan struct{})
	e.q.Submit(queue.High, "test: hold the queue", func(context.Context) error {
		close(started)
		<-done
		return nil
	})
	<-started
	return func() { close(done) }
}

// Artifact is the manifest record of artifact id; tests only.
func Artifact(e *Engine, id string) (manifest.Artifact, error) { return e.man.GetArtifact(id) }
