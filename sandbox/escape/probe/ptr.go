//go:build linux

package main

import "unsafe"

// unsafePointer turns a pointer into a system call argument.
func unsafePointer(p *byte) unsafe.Pointer { return unsafe.Pointer(p) }
