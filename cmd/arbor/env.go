package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	arbor "github.com/arbor-env/arbor/clients/go"
)

func init() { subcommands = append(subcommands, newEnvCmd) }

// Exit statuses of arbor env (docs/cli.md, "Exit status"). A step whose
// command exited non-zero exits with the command's status, as docker run,
// kubectl exec and ssh do.
const (
	exitUsage       = 64  // bad flags or arguments: nothing was sent (sysexits EX_USAGE)
	exitRefused     = 65  // the server refused the request as the caller's error (EX_DATAERR)
	exitUnavailable = 69  // no answer, or an infrastructure or retryable error: retrying may help (EX_UNAVAILABLE)
	exitTimedOut    = 124 // step: the command ran past its timeout and was killed (as timeout(1))
)

const envExitHelp = `Exit status:
  0     success (step: the command exited 0)
  N     step: the command exited N (1-255), passed through
  124   step: the command ran past its timeout and was killed
  64    usage error: bad flags or arguments, nothing was sent
  65    the server refused the request as the caller's error
        (invalid_params, unknown_env, unknown_state, unauthorized, ...,
        or an HTTP 4xx to the handshake: a wrong token or path)
  69    the server could not be reached or did not answer in time, or
        answered an infrastructure or retryable error (retrying may help)
  1     any other failure (a local file that cannot be read, ...)

With --output json a step prints the whole result (exit_code, timed_out)
whatever its status, so a script can tell a command's 64 from arbor's.`

// serverOnlyFlags are the root's persistent flags arbor env has no use
// for: its help leaves them out.
var serverOnlyFlags = []string{"state-dir", "backend", "pool-size", "criu"}

// envOptions are the flags every arbor env subcommand shares.
type envOptions struct {
	server  string
	token   string
	output  string
	asJSON  bool
	timeout time.Duration // the request's, --request-timeout
	// progress: auto (when stderr is a terminal), always or never: a
	// line on stderr while an answer is long in coming.
	progress string
}

// progressFirst and progressEvery pace the waiting lines of --progress.
const progressFirst, progressEvery = 3 * time.Second, 10 * time.Second

// waiting prints, until stop is called, a line on stderr when what has
// waited progressFirst for its answer, then every progressEvery, as
// --progress says.
func (o *envOptions) waiting(what string) (stop func()) {
	on := o.progress == "always"
	if o.progress == "auto" {
		st, err := os.Stderr.Stat()
		on = err == nil && st.Mode()&os.ModeCharDevice != 0
	}
	if !on {
		return func() {}
	}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		t := time.NewTimer(progressFirst)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(os.Stderr, "arbor: %s: waiting for the server's answer (%s; --request-timeout %s)\n",
					what, time.Since(start).Round(time.Second), o.timeout)
				t.Reset(progressEvery)
			}
		}
	}()
	return func() { close(done) }
}

// usageArgs makes an argument check's failure a usage error.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			return &exitError{code: exitUsage, err: err}
		}
		return nil
	}
}

// exitOf gives an error of a request its exit status.
func exitOf(err error) error {
	var pe *arbor.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, new(*exitError)):
		return err
	case errors.As(err, &pe):
		if pe.Infra || pe.Retryable {
			return &exitError{code: exitUnavailable, err: err}
		}
		return &exitError{code: exitRefused, err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{code: exitUnavailable, err: fmt.Errorf("no answer within --request-timeout: %w", err)}
	case errors.Is(err, arbor.ErrClosed):
		return &exitError{code: exitUnavailable, err: err}
	}
	return err
}

// dial connects to the server; a failure is exitUnavailable, or
// exitRefused when the server answered the handshake with a 4xx.
func (o *envOptions) dial(ctx context.Context) (*arbor.Client, error) {
	if o.token == "" {
		o.token = os.Getenv("ARBOR_TOKEN")
	}
	cl, err := arbor.Dial(ctx, o.server, &arbor.Options{Token: o.token})
	if err != nil {
		// A 4xx to the handshake (a wrong token, a wrong path) is the
		// caller's to fix: retrying will not help.
		if strings.Contains(err.Error(), "(HTTP 4") {
			return nil, &exitError{code: exitRefused, err: err}
		}
		return nil, &exitError{code: exitUnavailable, err: err}
	}
	return cl, nil
}

// checkOutput validates --output (and its shorthand --json).
func (o *envOptions) checkOutput() error {
	if o.progress != "auto" && o.progress != "always" && o.progress != "never" {
		return &exitError{code: exitUsage, err: fmt.Errorf("--progress %q: want auto, always or never", o.progress)}
	}
	if o.asJSON {
		o.output = "json"
	}
	if o.output != "text" && o.output != "json" {
		return &exitError{code: exitUsage, err: fmt.Errorf("--output %q: want text or json", o.output)}
	}
	return nil
}

func newEnvCmd(_ *globalOptions) *cobra.Command {
	o := &envOptions{}
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Drive envs of a running server (a thin client over protocol v1)",
		Long: `Drive envs of a running server: a thin client over protocol v1 (docs/cli.md).
The server is --server, else $ARBOR_URL, else $ARBOR_SERVER, else
127.0.0.1:7878; the token --token, else $ARBOR_TOKEN.

` + envExitHelp,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.server, "server", envOr("ARBOR_URL", envOr("ARBOR_SERVER", "127.0.0.1:7878")), "server address or ws:// URL (env ARBOR_URL, or ARBOR_SERVER)")
	pf.StringVar(&o.token, "token", "", "bearer token (env ARBOR_TOKEN)")
	pf.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	pf.BoolVar(&o.asJSON, "json", false, "print results as JSON (--output json)")
	pf.DurationVar(&o.timeout, "request-timeout", 10*time.Minute, "give up on the server's answer after this long")
	pf.StringVar(&o.progress, "progress", "auto", "say on stderr while an answer is long in coming: auto (stderr is a terminal), always, never")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{code: exitUsage, err: err} })
	// The root's flags of the server (state dir, backend) mean nothing
	// to a client: its help shows only --log-level and its own.
	help := cmd.HelpFunc()
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		for _, name := range serverOnlyFlags {
			if f := c.Root().PersistentFlags().Lookup(name); f != nil {
				f.Hidden = true
			}
		}
		help(c, args)
	})

	// run dials, calls fn and prints what it returns.
	run := func(c *cobra.Command, fn func(ctx context.Context, cl *arbor.Client) (any, error)) error {
		if err := o.checkOutput(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(c.Context(), o.timeout)
		defer cancel()
		cl, err := o.dial(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		stop := o.waiting(c.Name())
		v, err := fn(ctx, cl)
		stop()
		if err != nil {
			return exitOf(err)
		}
		if err := o.print(v); err != nil {
			return err
		}
		return stepStatus(v)
	}
	// call is a RunE that runs fn on the command's arguments.
	call := func(fn func(ctx context.Context, cl *arbor.Client, args []string) (any, error)) func(*cobra.Command, []string) error {
		return func(c *cobra.Command, args []string) error {
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return fn(ctx, cl, args) })
		}
	}

	var (
		task, img string
		seed      int64
	)
	reset := &cobra.Command{
		Use: "reset (--task NAME | --image NAME) [--seed N]", Short: "Start an episode; prints its env id", Args: usageArgs(cobra.NoArgs),
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
		Long: `Run one action in an env: a bash command (the default), write_file, read_file
or rollback. The command's stdout and stderr go to arbor's; its exit status
is arbor's (124 when it ran past --timeout).`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
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
					return &exitError{code: exitUsage, err: fmt.Errorf("step needs a command (or --write, --read, --rollback)")}
				}
				a = arbor.Bash(strings.Join(args[1:], " "), cmdTimeout)
			}
			// The answer comes after the command: wait for it at least
			// as long as the command may run.
			if need := cmdTimeout + time.Minute; cmdTimeout > 0 && o.timeout < need {
				o.timeout = need
			}
			return run(c, func(ctx context.Context, cl *arbor.Client) (any, error) { return cl.Step(ctx, args[0], a) })
		},
	}
	step.Flags().StringVar(&write, "write", "", "write_file: path in the env")
	step.Flags().StringVar(&from, "from", "-", "write_file: local file to send (- for stdin)")
	step.Flags().StringVar(&read, "read", "", "read_file: path in the env")
	step.Flags().StringVar(&rollbackTo, "rollback", "", "rollback tool: state id to return to")
	step.Flags().DurationVar(&cmdTimeout, "timeout", 0, "bash: the command's timeout (default: the task's or server's); past it the command is killed and arbor exits 124")
	step.Flags().DurationVar(&cmdTimeout, "cmd-timeout", 0, "bash: the command's timeout")
	step.Flags().MarkDeprecated("cmd-timeout", "use --timeout")

	var (
		n     int
		state string
	)
	br := &cobra.Command{
		Use: "branch (ENV | --state STATE) [-n N]", Short: "Fork an env's current state, or a state, into N envs", Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			p := arbor.BranchParams{StateID: state, N: n}
			if len(args) == 1 {
				p.EnvID = args[0]
			}
			return cl.Branch(ctx, p)
		}),
	}
	br.Flags().IntVarP(&n, "n", "n", 1, "number of children")
	br.Flags().StringVar(&state, "state", "", "state id to branch from")

	rb := &cobra.Command{
		Use: "rollback ENV STATE", Short: "Return an env to a state", Args: usageArgs(cobra.ExactArgs(2)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			return cl.Rollback(ctx, args[0], args[1])
		}),
	}
	ev := &cobra.Command{
		Use: "evaluate ENV", Short: "Run the task's verifier on a throwaway fork", Args: usageArgs(cobra.ExactArgs(1)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			return cl.Evaluate(ctx, args[0])
		}),
	}
	// each calls fn on every id in turn and reports them done as what.
	each := func(what string, fn func(ctx context.Context, cl *arbor.Client, id string) error) func(*cobra.Command, []string) error {
		return call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			for _, id := range args {
				if err := fn(ctx, cl, id); err != nil {
					return nil, err
				}
			}
			return &idsResult{what: what, IDs: args}, nil
		})
	}
	cl := &cobra.Command{
		Use: "close ENV...", Short: "Close envs", Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: each("closed", func(ctx context.Context, cl *arbor.Client, id string) error { return cl.CloseEnv(ctx, id) }),
	}
	ls := &cobra.Command{
		Use: "ls", Short: "List open envs", Args: usageArgs(cobra.NoArgs),
		RunE: call(func(ctx context.Context, cl *arbor.Client, _ []string) (any, error) { return cl.Envs(ctx) }),
	}
	states := &cobra.Command{
		Use: "states ENV", Short: "The lineage of an env's state, root first", Args: usageArgs(cobra.ExactArgs(1)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			return cl.States(ctx, args[0])
		}),
	}
	var toNode string
	mig := &cobra.Command{
		Use: "migrate ENV [--node NODE]", Short: "Move an env to another node of a cluster (through arbor router)", Args: usageArgs(cobra.ExactArgs(1)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			return cl.Migrate(ctx, args[0], toNode)
		}),
	}
	mig.Flags().StringVar(&toNode, "node", "", "the node to move it to (default: the least loaded other one)")
	cmd.AddCommand(reset, step, br, rb, ev, cl, ls, states, mig, newEnvExportCmd(o))
	cmd.AddCommand(newEnvStateCmds(call, each)...)
	return cmd
}

// stepStatus makes a step's command status arbor's: nil for anything else.
func stepStatus(v any) error {
	r, ok := v.(*arbor.StepResult)
	switch {
	case !ok:
		return nil
	case r.Obs.TimedOut:
		return &exitError{code: exitTimedOut}
	case r.Obs.ExitCode != 0:
		code := r.Obs.ExitCode & 0xff
		if code == 0 { // 256, or a negative status: still a failure
			code = 1
		}
		return &exitError{code: code}
	}
	return nil
}

func readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}

// print shows a result: JSON with --output json, else a short human form.
func (o *envOptions) print(v any) error {
	if o.output == "json" {
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
		if t, ok := v.(fmt.Stringer); ok {
			fmt.Print(t.String())
			return nil
		}
		enc := json.NewEncoder(os.Stdout)
		return enc.Encode(v)
	}
	return nil
}
