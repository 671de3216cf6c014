// Command mqmake creates the POSIX message queue named by its first
// argument ("/q1"), sends it its second argument and exits: the queue
// lives on in the IPC namespace without a holder. Built by
// TestPOSIXMessageQueueRefused (a busybox sandbox has no tool for it).
package main

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: mqmake /NAME MESSAGE")
		os.Exit(2)
	}
	name, err := unix.BytePtrFromString(strings.TrimPrefix(os.Args[1], "/"))
	if err != nil {
		fail(err)
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_WRONLY, 0o600, 0, 0, 0)
	if errno != 0 {
		fail(fmt.Errorf("mq_open %s: %w", os.Args[1], errno))
	}
	msg := []byte(os.Args[2])
	if _, _, errno := unix.Syscall6(unix.SYS_MQ_TIMEDSEND, fd, uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)), 0, 0, 0); errno != 0 {
		fail(fmt.Errorf("mq_send %s: %w", os.Args[1], errno))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mqmake:", err)
	os.Exit(1)
}
