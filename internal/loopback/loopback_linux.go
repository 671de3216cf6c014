// Package loopback brings up the loopback interface of the calling
// thread's network namespace: a sandbox's own (arbor-init) and the fresh
// ones restores get (cr/criu).
package loopback

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Up sets lo up and running.
func Up() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	// A namespace made up ahead (sandboxes in user namespace mode, whose
	// init may not change it) already has lo up.
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err == nil && ifr.Uint16()&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}
