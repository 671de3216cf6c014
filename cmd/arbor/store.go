package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/zfs"
	"github.com/arbor-env/arbor/internal/statelock"
)

// lockStateDir takes the state dir's lock (package statelock) for a
// command that owns the state dir: it mounts the pool and unmounts it when
// it ends, so a second one would pull the pool from under the first.
// Commands that only use the pool a server may have mounted (image,
// sandbox exec) leave it mounted and take no lock. wait is --wait-lock.
func lockStateDir(ctx context.Context, g *globalOptions, wait time.Duration) (*statelock.Lock, error) {
	l, err := statelock.Acquire(ctx, g.stateDir, wait, func(held error) {
		slog.Info("waiting for the state dir", slog.Any("held", held), slog.Duration("wait", wait))
	})
	if errors.Is(err, statelock.ErrHeld) {
		return nil, fmt.Errorf("%w; stop it first, or give --wait-lock DURATION to wait for it", err)
	}
	return l, err
}

// openSnapshotter opens the filesystem snapshot backend that the global
// flags select: btrfs in --state-dir (a --pool-size loop pool when that is
// not on btrfs), or zfs below the dataset named by ARBOR_ZFS_DATASET, else
// in a --pool-size pool file in --state-dir (zfs-fuse started and its
// compatibility shim wired in when needed; see docs/zfs.md).
func openSnapshotter(ctx context.Context, g *globalOptions) (cr.Snapshotter, error) {
	switch g.backend {
	case "btrfs", "":
		size, err := parseSize(g.poolSize)
		if err != nil {
			return nil, fmt.Errorf("parse --pool-size: %w", err)
		}
		s, err := btrfs.Open(ctx, btrfs.Options{StateDir: g.stateDir, PoolSize: size, Logger: slog.Default()})
		if err != nil {
			return nil, fmt.Errorf("open btrfs backend: %w", err)
		}
		return s, nil
	case "zfs":
		size, err := parseSize(g.poolSize)
		if err != nil {
			return nil, fmt.Errorf("parse --pool-size: %w", err)
		}
		// globalOptions has no dataset flag; the environment names one.
		// Without it the backend keeps its own pool file in the state dir.
		s, err := zfs.Open(ctx, zfs.Options{Dataset: envOr("ARBOR_ZFS_DATASET", ""), StateDir: g.stateDir, PoolSize: size, Logger: slog.Default()})
		if err != nil {
			return nil, fmt.Errorf("open zfs backend: %w", err)
		}
		return s, nil
	default:
		return nil, fmt.Errorf("unknown --backend %q (want btrfs or zfs)", g.backend)
	}
}

// unmounter is a snapshot backend that mounted its pool (the btrfs loop
// pool; the zfs pool file, exported, and the zfs-fuse it started) and can
// take it down.
type unmounter interface {
	Unmount(ctx context.Context) error
}

// unmountSnapshotter takes down the pool snap mounted, if any: arbor
// serve owns the state dir and leaves nothing mounted when it ends (after
// the engine closed, so that nothing uses the pool any more).
func unmountSnapshotter(snap cr.Snapshotter, log *slog.Logger) {
	u, ok := snap.(unmounter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := u.Unmount(ctx); err != nil {
		log.Warn("unmount snapshot pool", slog.Any("err", err))
	}
}

// parseSize reads a byte count with an optional binary suffix: "512M",
// "20G", "1T", "20GiB", or plain bytes.
func parseSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if t != "" {
		if i := strings.IndexByte("KMGTP", t[len(t)-1]); i >= 0 {
			mult = int64(1) << (10 * (i + 1))
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return int64(n * float64(mult)), nil
}
