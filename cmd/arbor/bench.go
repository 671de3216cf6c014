package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/benchmarks"
	"github.com/arbor-env/arbor/branch"
)

func init() { subcommands = append(subcommands, newBenchCmd) }

func newBenchCmd(g *globalOptions) *cobra.Command {
	var o benchmarks.Options
	var quick bool
	var lazy string
	var rerender bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare Arbor with full-every-turn, files-only, replay and runc on agent traces",
		Long: `Play the agent traces of benchmarks/traces through a real server (in this
process, on a loopback port, with a temporary btrfs pool) with a simulated think
time, and compare Arbor against baselines that really run: CRIU plus file
snapshot every turn, file snapshots only, replay, and runc checkpoint/restore.
Measures checkpoint latency by kind, turns per class, checkpoint bytes, exposed
latency, branch(n), recovery correctness of every turn, and Tree-GRPO-style
rollouts with branch vs replay. With --zfs, Arbor also runs on the zfs backend
(its own pool file, zfs-fuse started when needed) for a btrfs/ZFS table. Writes results.json, results.md and SVG plots
to --out. Needs root, CRIU 4.x and btrfs-progs (make deps).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if rerender {
				rep, err := benchmarks.Rerender(o.OutDir)
				if err != nil {
					return fmt.Errorf("--rerender: %w", err)
				}
				printGoals(rep)
				fmt.Printf("\nre-rendered %s\n", o.OutDir)
				return nil
			}
			if quick {
				o.BranchN = []int{1, 4, 8}
				o.BranchReps = 1
				o.Tree.Factors = []int{1, 4}
				o.Tree.M = 1
				o.ReplayStride = 4
			}
			n, err := parseSize(lazy)
			if err != nil {
				return fmt.Errorf("--lazy-restore: %w", err)
			}
			if o.LazyBytes = n; n == 0 {
				o.LazyBytes = -1 // Options: 0 takes the default
			}
			o.CRIU = g.criuPath
			o.Logger = slog.Default()
			start := time.Now()
			o.Progress = func(format string, args ...any) {
				fmt.Fprintf(os.Stderr, "bench [%5.0fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
			}
			rep, err := benchmarks.Run(c.Context(), o)
			if err != nil {
				return err
			}
			out := o.OutDir
			if out == "" {
				out = "benchmarks/results"
			}
			if err := rep.Write(out); err != nil {
				return fmt.Errorf("write results: %w", err)
			}
			if !o.BranchOnly {
				fmt.Print(rep.Headline())
				fmt.Println()
			}
			printGoals(rep)
			fmt.Printf("\nresults in %s (%.0f s)\n", out, rep.DurationS)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.OutDir, "out", "benchmarks/results", "folder for results.json, results.md and the plots")
	f.StringVar(&o.TracesDir, "traces", "", "folder of trace files (default: the traces built in)")
	f.StringSliceVar(&o.Only, "only", nil, "play only these traces")
	f.DurationVar(&o.Think, "think", 200*time.Millisecond, "simulated LLM think time between turns")
	f.IntSliceVar(&o.BranchN, "branch-n", nil, "fan-outs of branch(n) (default 1,2,4,8,16,32)")
	f.IntVar(&o.BranchReps, "branch-reps", 3, "timings per fan-out")
	f.IntSliceVar(&o.Tree.Factors, "tree-factors", nil, "branching factors of the tree rollouts (default 1-5)")
	f.IntVar(&o.Tree.Prefix, "tree-chain", 0, "turns of the trace in each tree's initial chain (0: the whole trace)")
	f.IntVar(&o.ReplayStride, "replay-stride", 2, "check every k-th turn by replay (the replay check costs O(turns^2))")
	f.BoolVar(&o.SkipRunc, "no-runc", false, "leave the runc baseline out")
	f.BoolVar(&o.BranchOnly, "branch-only", false, "measure branch(n) only: the small and the big sandbox from past states, eager and lazy, the children's memory, and runc beside them")
	f.IntVar(&o.BigMB, "big-mb", 256, "memory the big sandbox's process holds (MiB)")
	f.StringVar(&lazy, "lazy-restore", fmt.Sprintf("%dM", branch.DefaultLazyBytes>>20), "Arbor restores process images of at least this size lazily (0: every restore eager)")
	f.BoolVar(&o.TracesOnly, "traces-only", false, "play the traces through Arbor and check their recovery, nothing else (turn classes and CRIU dumps)")
	f.BoolVar(&o.ZFS, "zfs", false, "also play the traces through Arbor on the zfs backend and time branch(n) there (a ZFS column beside btrfs; zfs-fuse here, slow)")
	f.IntVar(&o.WarmCopies, "warm", 0, "pre-restored warm copies per env in Arbor's engine (0: cold branches)")
	f.StringVar(&o.Classifier, "classifier", "inspector", "Arbor's turn classification: inspector or full")
	f.StringVar(&o.WorkDir, "work-dir", "", "where the temporary state directory goes (default: the system temp dir)")
	f.BoolVar(&o.KeepWorkDir, "keep", false, "keep the temporary state directory")
	f.BoolVar(&rerender, "rerender", false, "run nothing: write results.md, the plots and the goals table again from --out's results.json (a run already made, the report of this build)")
	f.BoolVar(&quick, "quick", false, "a smaller run (branch 1,4,8 once; tree b=1,4; replay every 4th turn)")
	return cmd
}

// printGoals prints a report's goals table, one line each.
func printGoals(rep *benchmarks.Report) {
	for _, gl := range rep.Goals {
		met := "met"
		if !gl.Met {
			met = "NOT met"
		}
		fmt.Printf("goal %-55s %-10s %s (%s)\n", gl.Name, gl.Target, gl.Value, met)
	}
}
