package criu

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/loopback"
)

// netKey names the sandbox's network namespace as an external resource in
// dumps: it is not archived (a sandbox's namespace holds only loopback), and
// every restore gets a fresh loopback namespace instead. Archiving it would
// run ip and iptables-save several times per dump (~170 ms here).
const netKey = "arbor-netns"

// netnsInode returns the inode of pid's network namespace.
func netnsInode(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, fmt.Errorf("stat net namespace of %d: %w", pid, err)
	}
	return st.Ino, nil
}

// newLoopbackNetns makes a network namespace whose loopback is up and
// returns a descriptor of it. The calling thread enters the new namespace
// only for a moment and is put back before it is unlocked. It must not
// simply exit instead: restored sandboxes are children of whatever thread
// forked CRIU, and their parent-death signal (SIGKILL) fires when that
// thread ends.
func newLoopbackNetns() (_ *os.File, err error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("open own net namespace: %w", err)
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("unshare net namespace: %w", err)
	}
	defer func() {
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Left in the wrong namespace, this thread must die with its
			// locked goroutine rather than run other goroutines.
			err = fmt.Errorf("return to own net namespace: %w", serr)
			return
		}
		runtime.UnlockOSThread()
	}()
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	if err := loopback.Up(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
