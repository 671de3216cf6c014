package criu

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/internal/netns"
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
// returns a descriptor of it.
func newLoopbackNetns() (*os.File, error) { return netns.NewLoopback() }

// dumpInNetns starts a CRIU inside the network namespace of pid, for a
// tree in its own user namespace (DumpRequest.UserNS).
func (c *Checkpointer) dumpInNetns(pid int) (*spare, error) {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("open net namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	return c.startIn(ns)
}
