package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	arbor "github.com/arbor-env/arbor/clients/go"
)

func init() { subcommands = append(subcommands, newEnvCmd) }

// envOptions are the flags every arbor env subcommand shares.
type envOptions struct {
	server  string
	token   string
	asJSON  bool
	timeout time.Duration
}

func newEnvCmd(_ *globalOptions) *cobra.Command {
	o := &envOptions{}
	cmd := &cobra.Command{Use: "env", Short: "Drive envs of a running server (a thin client over protocol v1)"}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.server, "server", envOr("ARBOR_SERVER", "127.0.0.1:7878"), "server address or ws:// URL")
	pf.StringVar(&o.token, "token", os.Getenv("ARBOR_TOKEN"), "bearer token")
	pf.BoolVar(&o.asJSON, "json", false, "print results as JSON")
	pf.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up on the server after this long")

	// run dials, calls fn and prints what it returns.
	run := func(c *cobra.Command, fn func(ctx context.Context, cl *arbor.Client) (any, error)) error {
		ctx, cancel := context.WithTimeout(c.Context(), o.timeout)
		defer cancel()
		cl, err := arbor.Dial(ctx, o.server, &arbor.Options{Token: o.token})
		if err != nil {
			return err
		}
		defer cl.Close()
		v, err := fn(ctx, cl)
		if err != nil {
			return err
		}
		return o.print(v)
	}

	var (
		task, img string
		seed      int64
	)
	reset := &cobra.Command{
		Use: "reset (--task NAME | --image NAME) [--seed N]", Short: "Start an episode; prints its env id", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) {
				p := arbor.ResetParams{Task: task, Image: img}
				if c.Flags().Changed("seed") {
					p.Seed = &seed
				}
				return cl.Reset(ctx, p)
			})
		},
	}
	reset.Flags().StringVar(&task, "task", "", "task name")
	reset.Flags().StringVar(&img, "image", "", "image name (an episode without a task)")
	reset.Flags().Int64Var(&seed, "seed", 0, "seed")

	var (
		write, from, read, rollbackTo string
		cmdTimeout                    time.Duration
	)
	step := &cobra.Command{
		Use:   "step ENV [--] CMD... | step ENV --write PATH --from FILE | --read PATH | --rollback STATE",
		Short: "Run one action in an env: a bash command (the default), write_file, read_file or rollback",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			var a arbor.Action
			switch {
			case write != "":
				data, err := readInput(from)
				if err != nil {
					return err
				}
				a = arbor.WriteFile(write, data)
			case read != "":
				a = arbor.ReadFile(read)
			case rollbackTo != "":
				a = arbor.RollbackTo(rollbackTo)
			default:
				if len(args) < 2 {
					return fmt.Errorf("step needs a command (or --write, --read, --rollback)")
				}
				a = arbor.Bash(strings.Join(args[1:], " "), cmdTimeout)
			}
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Step(ctx, args[0], a) })
		},
	}
	step.Flags().StringVar(&write, "write", "", "write_file: path in the env")
	step.Flags().StringVar(&from, "from", "-", "write_file: local file to send (- for stdin)")
	step.Flags().StringVar(&read, "read", "", "read_file: path in the env")
	step.Flags().StringVar(&rollbackTo, "rollback", "", "rollback tool: state id to return to")
	step.Flags().DurationVar(&cmdTimeout, "cmd-timeout", 0, "bash: command timeout (default: the task's or server's)")

	var (
		n     int
		state string
	)
	br := &cobra.Command{
		Use: "branch (ENV | --state STATE) [-n N]", Short: "Fork an env's current state, or a state, into N envs", Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			p := arbor.BranchParams{StateID: state, N: n}
			if len(args) == 1 {
				p.EnvID = args[0]
			}
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Branch(ctx, p) })
		},
	}
	br.Flags().IntVarP(&n, "n", "n", 1, "number of children")
	br.Flags().StringVar(&state, "state", "", "state id to branch from")

	rb := &cobra.Command{
		Use: "rollback ENV STATE", Short: "Return an env to a state", Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Rollback(ctx, args[0], args[1]) })
		},
	}
	ev := &cobra.Command{
		Use: "evaluate ENV", Short: "Run the task's verifier on a throwaway fork", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Evaluate(ctx, args[0]) })
		},
	}
	cl := &cobra.Command{
		Use: "close ENV...", Short: "Close envs", Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) {
				for _, id := range args {
					if err := cl.CloseEnv(ctx, id); err != nil {
						return nil, err
					}
				}
				return map[string]any{"closed": args}, nil
			})
		},
	}
	ls := &cobra.Command{
		Use: "ls", Short: "List open envs", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Envs(ctx) })
		},
	}
	states := &cobra.Command{
		Use: "states ENV", Short: "The lineage of an env's state, root first", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.States(ctx, args[0]) })
		},
	}
	var toNode string
	mig := &cobra.Command{
		Use: "migrate ENV [--node NODE]", Short: "Move an env to another node of a cluster (through arbor router)", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Migrate(ctx, args[0], toNode) })
		},
	}
	mig.Flags().StringVar(&toNode, "node", "", "the node to move it to (default: the least loaded other one)")
	cmd.AddCommand(reset, step, br, rb, ev, cl, ls, states, mig, newEnvExportCmd(o))
	return cmd
}

func readInput(path string) ([]byte, error) {
	if path == "-" {
		return readAll(os.Stdin)
	}
	return os.ReadFile(path)
}

func readAll(f *os.File) ([]byte, error) { return io.ReadAll(f) }

// print shows a result: JSON with --json, else a short human form.
func (o *envOptions) print(v any) error {
	if o.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	switch r := v.(type) {
	case *arbor.ResetResult:
		fmt.Printf("env %s  state %s\n", r.EnvID, r.Info.StateID)
		if r.Obs.Instruction != "" {
			fmt.Print(strings.TrimRight(r.Obs.Instruction, "\n"), "\n")
		}
	case *arbor.StepResult:
		os.Stdout.WriteString(string(r.Obs.Stdout))
		os.Stderr.WriteString(string(r.Obs.Stderr))
		fmt.Fprintf(os.Stderr, "[exit %d, cwd %s, %.1f ms, turn %d, state %s (%s)", r.Obs.ExitCode, r.Obs.Cwd,
			r.Obs.DurationS*1000, r.Info.Turn, r.Info.StateID, r.Info.Checkpoint)
		if r.Obs.TimedOut {
			fmt.Fprint(os.Stderr, ", timed out")
		}
		if r.Truncated {
			fmt.Fprint(os.Stderr, ", max turns reached")
		}
		fmt.Fprintln(os.Stderr, "]")
	case *arbor.BranchResult:
		for i, id := range r.EnvIDs {
			if id == "" && r.Errors != nil && r.Errors[i] != nil {
				fmt.Printf("child %d failed: %v\n", i, r.Errors[i])
				continue
			}
			fmt.Println(id)
		}
		fmt.Fprintf(os.Stderr, "[from state %s in %.0f ms]\n", r.StateID, r.TookS*1000)
	case *arbor.Info:
		fmt.Printf("env at state %s (turn %d)\n", r.StateID, r.Turn)
	case *arbor.Evaluation:
		fmt.Printf("reward %g\n", r.Reward)
		for k, v := range r.Details {
			fmt.Printf("  %s: %v\n", k, v)
		}
	case []arbor.EnvInfo:
		fmt.Printf("%-14s %-10s %-10s %-14s %5s %8s\n", "ENV", "IMAGE", "TASK", "HEAD", "TURN", "IDLE")
		for _, e := range r {
			fmt.Printf("%-14s %-10s %-10s %-14s %5d %7.0fs\n", e.EnvID, e.Image, e.Task, e.Head, e.Turn, e.IdleS)
		}
	case *arbor.StatesResult:
		for _, s := range r.States {
			mark := " "
			if s.StateID == r.Head {
				mark = "*"
			}
			fmt.Printf("%s %-14s turn %-4d %-5s env %s  %s\n", mark, s.StateID, s.Turn, s.Kind, s.EnvID, s.Created)
		}
	default:
		enc := json.NewEncoder(os.Stdout)
		return enc.Encode(v)
	}
	return nil
}
