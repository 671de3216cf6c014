package criu

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
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
// returns a descriptor of it. The thread that made it is thrown away, so
// no goroutine ever runs in the wrong namespace.
func newLoopbackNetns() (*os.File, error) {
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{err: fmt.Errorf("unshare net namespace: %w", err)}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- res{err: err}
			return
		}
		if err := loopbackUp(); err != nil {
			f.Close()
			ch <- res{err: err}
			return
		}
		ch <- res{f: f}
	}()
	r := <-ch
	return r.f, r.err
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}
