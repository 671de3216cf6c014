package statelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// pollEvery is how often Acquire retries a held lock while it waits.
const pollEvery = 100 * time.Millisecond

// Lock is a held state dir lock.
type Lock struct {
	f *os.File
}

// Acquire takes the lock of the state dir dir (made if missing) and writes
// this process's pid in it. When another process holds it, Acquire fails
// at once with a *HeldError if wait is 0, else retries until it is free,
// wait has passed (the *HeldError of the last try) or ctx ends. waiting,
// when not nil, is called once with the holder's error when Acquire
// starts to wait.
func Acquire(ctx context.Context, dir string, wait time.Duration, waiting func(error)) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	// Go opens with O_CLOEXEC: the lock is on this open file
	// description, which no child (CRIU, zfs-fuse, a sandbox) inherits
	// and so keeps alive after this process ends.
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open state dir lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for first := true; ; first = false {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock state dir %s: %w", dir, err)
		}
		held := &HeldError{Dir: dir, PID: holder(f)}
		if wait <= 0 || !time.Now().Before(deadline) {
			f.Close()
			return nil, held
		}
		if first && waiting != nil {
			waiting(held)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for %w: %w", held, ctx.Err())
		case <-time.After(min(pollEvery, time.Until(deadline))):
		}
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write pid in state dir lock: %w", err)
	}
	return &Lock{f: f}, nil
}

// holder is the pid written in the lock file f (0 when none is yet).
func holder(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	return pid
}

// Release empties the lock file and releases the lock.
func (l *Lock) Release() error {
	terr := l.f.Truncate(0)
	if err := l.f.Close(); err != nil { // closing drops the flock
		return fmt.Errorf("release state dir lock: %w", err)
	}
	if terr != nil {
		return fmt.Errorf("empty state dir lock: %w", terr)
	}
	return nil
}
