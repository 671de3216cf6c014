package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
)

func init() { subcommands = append(subcommands, newSandboxCmd) }

func newSandboxCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Short: "Try sandboxes by hand"}
	var (
		imageName string
		asJSON    bool
		timeout   time.Duration
		maxOut    int
		lim       sandbox.Limits
		memory    string
		disk      string
		userNS    userNSFlags
	)
	exec := &cobra.Command{
		Use:   "exec --image NAME [--json] -- CMD [CMD...]",
		Short: "Start a fresh sandbox, run each CMD in its persistent shell, print the results, destroy it",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			if memory != "" {
				n, err := parseSize(memory)
				if err != nil {
					return fmt.Errorf("parse --memory: %w", err)
				}
				lim.MemoryBytes = n
			}
			var err error
			if lim.DiskBytes, err = parseDisk(disk); err != nil {
				return err
			}
			snap, err := openSnapshotter(ctx, g)
			if err != nil {
				return err
			}
			l := &launch.Launcher{
				Snap: snap, Images: &image.Store{Snap: snap, Logger: slog.Default()},
				Limits: lim, AutoBuild: true, Progress: os.Stderr, Logger: slog.Default(),
			}
			if l.UserNS, err = userNS.config(); err != nil {
				return err
			}
			env, err := l.Launch(ctx, imageName)
			if err != nil {
				return err
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := env.Close(ctx); err != nil {
					slog.Error("destroy sandbox", slog.String("env", env.ID), slog.Any("err", err))
				}
			}()
			enc := json.NewEncoder(os.Stdout)
			for _, a := range args {
				r, err := env.Sandbox.Exec(ctx, a, sandbox.ExecOptions{Timeout: timeout, MaxOutput: maxOut})
				if err != nil {
					return err
				}
				if asJSON {
					enc.Encode(resultJSON(a, r))
					continue
				}
				printResult(a, r)
			}
			return nil
		},
	}
	f := exec.Flags()
	f.StringVar(&imageName, "image", "busybox", "image to start (built on first use if it has a recipe)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per command")
	userNS.add(f)
	f.DurationVar(&timeout, "timeout", 60*time.Second, "per-command timeout")
	f.IntVar(&maxOut, "max-output", 0, "cap on each of stdout and stderr in bytes (default 256 KiB)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 512M (default 1G)")
	f.Int64Var(&lim.Pids, "pids", 0, "process limit (default 512)")
	f.Float64Var(&lim.CPUs, "cpus", 0, "CPU limit in cores (default 1)")
	f.StringVar(&disk, "disk", "", diskFlagHelp)
	cmd.AddCommand(exec)
	return cmd
}

const diskFlagHelp = "disk quota per sandbox: what it may write to its root, checkpointed data included, e.g. 512M (default 2G; none: no quota)"

// parseDisk reads a --disk value into sandbox.Limits.DiskBytes: "" is 0
// (the default quota), "none" or a negative number is -1 (no quota).
func parseDisk(s string) (int64, error) { return parseLimit("--disk", s) }

// parseLimit reads a byte limit flag: "" is the default (0), "none" or a
// negative number no limit (-1), else a size (never 0).
func parseLimit(flag, s string) (int64, error) {
	switch t := strings.TrimSpace(s); {
	case t == "":
		return 0, nil
	case strings.EqualFold(t, "none") || strings.HasPrefix(t, "-"):
		return -1, nil
	}
	n, err := parseSize(s)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", flag, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("parse %s: 0 would refuse every write; use none for no limit", flag)
	}
	return n, nil
}

// execResult is the JSON form of one command's result.
type execResult struct {
	Cmd            string   `json:"cmd"`
	Stdout         string   `json:"stdout"`
	Stderr         string   `json:"stderr"`
	ExitCode       int      `json:"exit_code"`
	Cwd            string   `json:"cwd"`
	TimedOut       bool     `json:"timed_out"`
	Truncated      bool     `json:"truncated"`
	StdoutBytes    int64    `json:"stdout_bytes"`
	StderrBytes    int64    `json:"stderr_bytes"`
	DurationS      float64  `json:"duration_s"`
	ShellRestarted bool     `json:"shell_restarted,omitempty"`
	Limits         []string `json:"limits,omitempty"`
}

func resultJSON(cmd string, r *sandbox.Result) execResult {
	out := execResult{
		Cmd: cmd, Stdout: string(r.Stdout), Stderr: string(r.Stderr), ExitCode: r.ExitCode, Cwd: r.Cwd,
		TimedOut: r.TimedOut, Truncated: r.Truncated, StdoutBytes: r.StdoutBytes, StderrBytes: r.StderrBytes,
		DurationS: r.Duration.Seconds(), ShellRestarted: r.ShellRestarted,
	}
	for _, e := range r.Limits {
		out.Limits = append(out.Limits, e.String())
	}
	return out
}

func printResult(cmd string, r *sandbox.Result) {
	fmt.Printf("$ %s\n", cmd)
	os.Stdout.Write(r.Stdout)
	os.Stdout.Write(r.Stderr)
	fmt.Printf("[exit %d, cwd %s, %.1f ms", r.ExitCode, r.Cwd, float64(r.Duration.Microseconds())/1000)
	if r.TimedOut {
		fmt.Print(", timed out")
	}
	if r.Truncated {
		fmt.Printf(", output truncated from %d+%d bytes", r.StdoutBytes, r.StderrBytes)
	}
	if r.ShellRestarted {
		fmt.Print(", shell restarted")
	}
	fmt.Println("]")
	for _, e := range r.Limits {
		fmt.Printf("[limit] %s\n", e)
	}
}
