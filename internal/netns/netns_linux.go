// Package netns makes the loopback-only network namespaces sandboxes run in
// and runs code on a thread inside one: restores get a fresh one (cr/criu),
// and so do sandboxes started in user namespace mode, whose network
// namespace stays owned by the host's user namespace (docs/sandbox.md).
package netns

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/loopback"
)

// NewLoopback makes a network namespace whose loopback is up and returns a
// descriptor of it.
func NewLoopback() (*os.File, error) {
	var f *os.File
	err := do(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare net namespace: %w", err)
		}
		var err error
		if f, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			return err
		}
		if err := loopback.Up(); err != nil {
			f.Close()
			return err
		}
		return nil
	})
	return f, err
}

// Do runs fn on a locked OS thread that is in network namespace ns while fn
// runs; processes fn starts there are born in ns. The thread is put back
// into its own namespace afterwards and lives on: it must not simply exit
// instead, because children it forked (sandboxes, CRIU and the trees CRIU
// restores as its siblings) get their parent-death signal when it ends.
func Do(ns *os.File, fn func() error) error {
	return do(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter net namespace: %w", err)
		}
		return fn()
	})
}

// do runs fn on a locked thread and returns the thread to its original
// network namespace.
func do(fn func() error) (err error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own net namespace: %w", err)
	}
	defer orig.Close()
	defer func() {
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Left in the wrong namespace, this thread must die with its
			// locked goroutine rather than run other goroutines.
			err = fmt.Errorf("return to own net namespace: %w", serr)
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// AllowUnprivileged lets every id of the calling thread's network namespace
// bind ports below 1024 and use ICMP echo sockets. A sandbox in user
// namespace mode has no capabilities over its network namespace, which the
// host's user namespace owns, so without this its root could not listen on
// port 80 or ping loopback as it can in the other mode.
func AllowUnprivileged() error {
	for _, s := range [][2]string{
		{"/proc/sys/net/ipv4/ip_unprivileged_port_start", "0"},
		{"/proc/sys/net/ipv4/ping_group_range", "0 2147483647"},
	} {
		if err := os.WriteFile(s[0], []byte(s[1]), 0); err != nil {
			return fmt.Errorf("set %s: %w", s[0], err)
		}
	}
	return nil
}
