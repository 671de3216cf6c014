package branch

import (
	"sync/atomic"
	"time"
)

// The phases of a restore, in order, whose summed times the engine keeps
// (CoordStats.RestorePhases): where a branch child's time goes.
const (
	PhaseManifest = "manifest" // the state's and artifacts' records
	PhaseImage    = "image"    // pin the process image (load it from disk when cold)
	PhaseClone    = "clone"    // writable clone of the file snapshot
	PhaseQuota    = "quota"    // disk quota, user namespace mode, isolation record
	PhaseCgroup   = "cgroup"   // the new sandbox's cgroups
	PhaseCRIU     = "criu"     // CRIU restore (a lazy restore's daemon start included)
	PhaseSandbox  = "sandbox"  // init answers, isolation checked
	PhaseShell    = "shell"    // a shell delta run and checked
	PhaseAdopt    = "adopt"    // a branch child registered (manifest, inspector)
	// PhaseLazyStart is how long a lazy restore's daemon took to start,
	// beside the phases from PhaseClone on (it overlaps them).
	PhaseLazyStart = "criu: lazy-pages start"
)

// restorePhases lists the phases in order.
var restorePhases = []string{PhaseManifest, PhaseImage, PhaseClone, PhaseQuota, PhaseCgroup, PhaseCRIU, PhaseSandbox, PhaseShell, PhaseAdopt, PhaseLazyStart}

// RestorePhaseNames lists the phases in CoordStats.RestorePhases, in
// their order in a restore (PhaseLazyStart, which overlaps others, last).
func RestorePhaseNames() []string { return append([]string(nil), restorePhases...) }

// phaseStats sums the restores' phase times.
type phaseStats struct {
	restores atomic.Int64
	nanos    [10]atomic.Int64 // by index in restorePhases
}

func (p *phaseStats) add(phase string, d time.Duration) {
	for i, n := range restorePhases {
		if n == phase {
			p.nanos[i].Add(int64(d))
		}
	}
}

// snapshot returns the restores counted and each phase's summed time.
func (p *phaseStats) snapshot() (int64, map[string]time.Duration) {
	m := make(map[string]time.Duration, len(restorePhases))
	for i, n := range restorePhases {
		m[n] = time.Duration(p.nanos[i].Load())
	}
	return p.restores.Load(), m
}

// phaseClock times one restore's phases: mark ends the phase named and
// starts the next.
type phaseClock struct {
	p    *phaseStats
	last time.Time
	took [10]time.Duration
}

func (p *phaseStats) start() *phaseClock { return &phaseClock{p: p, last: time.Now()} }

func (c *phaseClock) mark(phase string) {
	now := time.Now()
	for i, n := range restorePhases {
		if n == phase {
			c.took[i] += now.Sub(c.last)
		}
	}
	c.last = now
}

// done adds a successful restore's times to the totals.
func (c *phaseClock) done(ok bool) {
	if !ok {
		return
	}
	c.p.restores.Add(1)
	for i, d := range c.took {
		c.p.nanos[i].Add(int64(d))
	}
}
