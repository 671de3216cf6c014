package statelock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAcquire: a second Acquire on a held dir fails at once naming the
// holder's pid, or with a wait gets the lock once the first is released;
// the lock file holds the holder's pid and is emptied on release. (flock
// locks belong to open file descriptions, so two in one process conflict
// as two processes do.)
func TestAcquire(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	ctx := context.Background()
	l, err := Acquire(ctx, dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, want this pid %d", got, os.Getpid())
	}

	start := time.Now()
	_, err = Acquire(ctx, dir, 0, nil)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) || held.PID != os.Getpid() {
		t.Fatalf("second Acquire: %v, want a HeldError naming pid %d", err, os.Getpid())
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("second Acquire without wait took %s", d)
	}
	if !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("message %q does not name the pid", err)
	}

	// With a wait shorter than the hold: the same error after the wait.
	start = time.Now()
	if _, err := Acquire(ctx, dir, 300*time.Millisecond, nil); !errors.Is(err, ErrHeld) {
		t.Fatalf("Acquire with a short wait: %v, want ErrHeld", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Acquire gave up after %s of a 300ms wait", d)
	}

	// With a longer wait: the lock once the holder releases it.
	waited := make(chan error, 1)
	got := make(chan error, 1)
	go func() {
		l2, err := Acquire(ctx, dir, time.Minute, func(err error) { waited <- err })
		if err == nil {
			err = l2.Release()
		}
		got <- err
	}()
	if err := <-waited; !errors.Is(err, ErrHeld) {
		t.Fatalf("waiting called with %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiting Acquire: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Acquire did not get the released lock")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, FileName)); len(b) != 0 {
		t.Errorf("released lock file holds %q", b)
	}

	// A wait ends with its context.
	l, err = Acquire(ctx, dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := Acquire(cctx, dir, time.Minute, nil); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrHeld) {
		t.Errorf("Acquire past its context: %v", err)
	}
}
