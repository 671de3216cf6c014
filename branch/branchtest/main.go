package branchtest

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/arbor-env/arbor/cr/zfs"
)

// HelperVar, set in the environment of a test binary that a test runs as
// a helper process, tells Main not to make the package's shared Rig.
const HelperVar = "ARBOR_TEST_HELPER"

// Main is a package's TestMain on one shared Rig made with o: setup (nil:
// none) then builds what the package's tests share on it (a task pool)
// and returns its cleanup, which runs before the Rig closes. Only ErrSkip
// ("cannot run here") skips: *skip gets its message and the tests skip
// with it; any other setup error fails the run (exit 1). Main does not
// return.
//
// Main also makes the test binary the zfs-fuse shim when it is run as
// "zfs", so a package whose TestMain is Main can use zfs Rigs.
//
// In a helper process (HelperVar set: a test that runs its own binary to
// crash it) Main makes no shared Rig and *skip says so: a helper killed by
// SIGKILL runs no clean-up, and a shared Rig would stay mounted.
func Main(m *testing.M, pkg string, o Options, skip *string, setup func(*Rig) (cleanup func(), err error)) {
	// Started as "zfs": the zfs-fuse shim of a zfs Rig (see zfs.PrepareHost).
	zfs.MainIfShim()
	if os.Getenv(HelperVar) != "" {
		*skip = "a helper process of another test: no shared engine"
		os.Exit(m.Run())
	}
	r, err := New(o)
	var cleanup func()
	if err == nil && setup != nil {
		if cleanup, err = setup(r); err != nil {
			r.Close()
			r = nil
		}
	}
	switch {
	case errors.Is(err, ErrSkip):
		*skip = err.Error()
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s tests: set up the engine: %v\n", pkg, err)
		os.Exit(1)
	}
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	if r != nil {
		r.Close()
	}
	os.Exit(code)
}
