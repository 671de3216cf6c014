// Command arbor-init is pid 1 inside every Arbor sandbox (see package
// sandbox/initd). The server starts it as "arbor-init setup ROOT HOSTNAME
// CAPS" in fresh namespaces, CAPS being the hex capability mask to keep
// (the seccomp program then comes on fd 5) or "unhardened"; it
// re-executes itself as "arbor-init run".
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"github.com/arbor-env/arbor/sandbox/initd"
)

// The main goroutine stays on the main thread: init forks the shell from
// it (see initd.Run), and stage one drops the privileges of this thread,
// the one that execs stage two.
func init() { runtime.LockOSThread() }

func main() {
	var err error
	switch {
	case len(os.Args) == 5 && os.Args[1] == "setup":
		o := initd.SetupOptions{Root: os.Args[2], Hostname: os.Args[3], SyncFD: 3, ReadyFD: 4, SeccompFD: 5}
		if os.Args[4] != "unhardened" {
			var caps uint64
			if caps, err = strconv.ParseUint(os.Args[4], 16, 64); err == nil {
				o.Harden = &initd.Hardening{Caps: caps}
			}
		}
		if err == nil {
			err = initd.Setup(o) // reports its error on the ready pipe
		} else {
			fmt.Fprintf(os.NewFile(uintptr(o.ReadyFD), "ready"), "error: setup: %v\n", err)
		}
	case len(os.Args) == 2 && os.Args[1] == "run":
		err = initd.Run()
	default:
		err = fmt.Errorf("usage: arbor-init setup ROOT HOSTNAME CAPS|unhardened | arbor-init run (started by the arbor server)")
	}
	fmt.Fprintln(os.Stderr, "arbor-init:", err)
	os.Exit(1)
}
