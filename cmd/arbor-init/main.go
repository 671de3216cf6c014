// Command arbor-init is pid 1 inside every Arbor sandbox (see package
// sandbox/initd). The server starts it as "arbor-init setup ROOT HOSTNAME"
// in fresh namespaces; it re-executes itself as "arbor-init run".
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/arbor-env/arbor/sandbox/initd"
)

// The main goroutine stays on the main thread: init forks the shell from
// it (see initd.Run).
func init() { runtime.LockOSThread() }

func main() {
	var err error
	switch {
	case len(os.Args) == 4 && os.Args[1] == "setup":
		err = initd.Setup(initd.SetupOptions{Root: os.Args[2], Hostname: os.Args[3], SyncFD: 3, ReadyFD: 4})
		if err != nil {
			fmt.Fprintf(os.NewFile(4, "ready"), "error: setup: %v\n", err)
		}
	case len(os.Args) == 2 && os.Args[1] == "run":
		err = initd.Run()
	default:
		err = fmt.Errorf("usage: arbor-init setup ROOT HOSTNAME | arbor-init run (started by the arbor server)")
	}
	fmt.Fprintln(os.Stderr, "arbor-init:", err)
	os.Exit(1)
}
