// Command arbor is the Arbor environment server and its command-line tools.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/cr/zfs"
)

// globalOptions are the flags every subcommand shares.
type globalOptions struct {
	stateDir string
	backend  string
	poolSize string
	criuPath string
	logLevel string
}

func main() {
	// Started as "zfs" (the symlink the zfs backend puts first in PATH on
	// zfs-fuse): be the zfs-fuse compatibility shim for go-zfs.
	zfs.MainIfShim()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "arbor:", msg)
		}
		os.Exit(exitCode(err))
	}
}

// exitError carries a specific exit status out of a subcommand; with no
// err, arbor exits with it silently (a step's command's status).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	if e := (*exitError)(nil); errors.As(err, &e) {
		return e.code
	}
	return 1
}

func newRootCmd() *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:           "arbor",
		Short:         "Arbor: branchable shell sandboxes for agent RL",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
				return fmt.Errorf("parse --log-level: %w", err)
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
			return nil
		},
	}
	f := root.PersistentFlags()
	f.StringVar(&g.stateDir, "state-dir", envOr("ARBOR_STATE_DIR", "/var/lib/arbor"), "state directory (pool, images, manifest)")
	f.StringVar(&g.backend, "backend", envOr("ARBOR_BACKEND", "btrfs"), "filesystem snapshot backend: btrfs or zfs")
	f.StringVar(&g.poolSize, "pool-size", envOr("ARBOR_POOL_SIZE", "20G"), "size of the pool file created in the state dir: btrfs when the state dir is not on btrfs, zfs when ARBOR_ZFS_DATASET is unset")
	f.StringVar(&g.criuPath, "criu", envOr("ARBOR_CRIU", ""), "CRIU binary (default: the private CRIU 4.x that make deps installs, else criu on PATH)")
	f.StringVar(&g.logLevel, "log-level", envOr("ARBOR_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	for _, add := range subcommands {
		root.AddCommand(add(g))
	}
	return root
}

// subcommands is filled by each command file's init, so commands live in
// their own files.
var subcommands []func(*globalOptions) *cobra.Command

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
