package inspector

import (
	"context"
	"errors"
	"fmt"
)

// bounded runs f and returns its result, or as soon as ctx ends first
// ErrStalled (ctx's deadline passed) or ctx's error (cancelled). f runs in
// its own goroutine because a file-system call ignores ctx: a stat on a
// FUSE mount whose daemon hangs blocks in the kernel until the daemon
// answers. f must check ctx between its calls (the comparisons do, between
// chunks of at most 1 MiB) so that its goroutine ends with the call; only
// a call blocked in the kernel keeps it longer, and its result is dropped.
func bounded[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var zero T
	if ctx.Err() != nil {
		return zero, ended(ctx)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		if r.err != nil && ctx.Err() != nil {
			// f stopped because ctx ended: report that as the
			// select would have.
			return zero, ended(ctx)
		}
		return r.v, r.err
	case <-ctx.Done():
		return zero, ended(ctx)
	}
}

// ended is the error of a comparison whose ctx ended: ErrStalled when its
// deadline passed, ctx's error when the caller gave up (no stall to
// report).
func ended(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrStalled, context.Cause(ctx))
	}
	return ctx.Err()
}
