// Package bpf holds Arbor's eBPF programs and loads them: syscall
// tracepoints that report every call able to change a file tree, and
// process fork/exec/exit, for the tasks of the cgroups user space tracks.
// The objects are compiled by bpf2go (make generate) and committed, so
// building needs no clang. Only amd64 is supported: the programs decode
// x86_64 syscall numbers and registers.
package bpf

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -type event tracker tracker.c
