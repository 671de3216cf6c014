package sandbox

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// reap waits for the child pid (a sandbox's init, started or restored) to
// exit and collects it. It waits in the runtime's netpoller, on a pidfd,
// so that a sandbox holds no OS thread for its lifetime: os.Process.Wait
// blocks one in waitid, and with it the server's threads grew with its
// open sandboxes and never shrank (the runtime keeps idle threads).
func reap(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		// No pidfd (a kernel before 5.10): wait the old way.
		_, err := wait4(pid, &ws, 0)
		return ws, err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return ws, fmt.Errorf("wait for %d: %w", pid, err)
	}
	var werr error
	// The pidfd turns readable when the process exits; until then the
	// callback returns false and the poller parks the goroutine.
	err = rc.Read(func(uintptr) bool {
		var got int
		got, werr = wait4(pid, &ws, unix.WNOHANG)
		return got != 0 || werr != nil
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return ws, fmt.Errorf("wait for %d: %w", pid, err)
	}
	return ws, nil
}

func wait4(pid int, ws *unix.WaitStatus, opts int) (int, error) {
	for {
		got, err := unix.Wait4(pid, ws, opts, nil)
		if !errors.Is(err, unix.EINTR) {
			return got, err
		}
	}
}
