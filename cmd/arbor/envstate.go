package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	arbor "github.com/arbor-env/arbor/clients/go"
)

// envCaller is a RunE that dials the server, calls fn on the command's
// arguments and prints what it returns (the call of newEnvCmd).
type envCaller = func(fn func(ctx context.Context, cl *arbor.Client, args []string) (any, error)) func(*cobra.Command, []string) error

// idsRunner runs fn on each argument in turn and reports them done (the
// each of newEnvCmd).
type idsRunner = func(what string, fn func(ctx context.Context, cl *arbor.Client, id string) error) func(*cobra.Command, []string) error

// idsResult is what close, discard, pin, unpin and release print: the ids
// they acted on, under the verb as the JSON key.
type idsResult struct {
	what string
	IDs  []string
}

func (r *idsResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string][]string{r.what: r.IDs})
}

func (r *idsResult) String() string {
	var b strings.Builder
	for _, id := range r.IDs {
		fmt.Fprintf(&b, "%s %s\n", r.what, id)
	}
	return b.String()
}

// promoteResult is promote's answer, printed for people; its JSON is the
// embedded answer's, as for prepareResult and tasksResult.
type promoteResult struct{ *arbor.PromoteResult }

func (r promoteResult) String() string {
	return fmt.Sprintf("env %s now at state %s (the branch is closed)\n", r.EnvID, r.StateID)
}

// prepareResult is prepare's answer, one line a state for people.
type prepareResult struct{ *arbor.PrepareResult }

func (r prepareResult) String() string {
	var b strings.Builder
	ids := make([]string, 0, len(r.Prepared))
	for id := range r.Prepared {
		ids = append(ids, id)
	}
	for id := range r.Refused {
		if _, ok := r.Prepared[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "%s prepared %d ready %d", id, r.Prepared[id], r.Ready[id])
		if n := r.Refused[id]; n > 0 {
			fmt.Fprintf(&b, " refused %d (over the server's budget)", n)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// tasksResult is a page of tasks, a table for people.
type tasksResult struct{ *arbor.TasksResult }

func (r tasksResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-24s %-24s %-10s %5s  %s\n", "TASK", "IMAGE", "DIFFICULTY", "TURNS", "TAGS")
	for _, t := range r.Tasks {
		if t.Error != "" {
			fmt.Fprintf(&b, "%-24s error: %s\n", t.Name, t.Error)
			continue
		}
		fmt.Fprintf(&b, "%-24s %-24s %-10s %5d  %s\n", t.Name, t.Image, t.Difficulty, t.MaxTurns, strings.Join(t.Tags, ","))
	}
	for _, d := range r.Datasets {
		fmt.Fprintf(&b, "dataset %s: %d instances (arbor env tasks --dataset %s)\n", d.Name, d.Instances, d.Name)
	}
	if r.NextCursor != "" {
		fmt.Fprintf(&b, "more: --cursor %s\n", r.NextCursor)
	}
	return b.String()
}

// newEnvStateCmds are the subcommands of arbor env over a branch's fate
// (promote, discard), states (prepare, pin, unpin, release) and the
// server's tasks.
func newEnvStateCmds(call envCaller, each idsRunner) []*cobra.Command {
	promote := &cobra.Command{
		Use: "promote ENV", Short: "Make a branch's state its origin env's, and close the branch", Args: usageArgs(cobra.ExactArgs(1)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			r, err := cl.Promote(ctx, args[0])
			return promoteResult{r}, err
		}),
	}
	discard := &cobra.Command{
		Use: "discard ENV...", Short: "Throw branches away", Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: each("discarded", func(ctx context.Context, cl *arbor.Client, id string) error { return cl.Discard(ctx, id) }),
	}
	var (
		n    int
		wait bool
	)
	prepare := &cobra.Command{
		Use: "prepare STATE... [-n N] [--wait]", Short: "Restore N frozen copies of each state ahead of branches from it", Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			r, err := cl.Prepare(ctx, args, n, wait)
			return prepareResult{r}, err
		}),
	}
	prepare.Flags().IntVarP(&n, "n", "n", 1, "copies of each state")
	prepare.Flags().BoolVar(&wait, "wait", false, "answer once the copies are ready")
	// pin, unpin and release are all or none over their ids: one request.
	stateIDs := func(what string, fn func(cl *arbor.Client, ctx context.Context, ids ...string) error) func(*cobra.Command, []string) error {
		return call(func(ctx context.Context, cl *arbor.Client, args []string) (any, error) {
			return &idsResult{what: what, IDs: args}, fn(cl, ctx, args...)
		})
	}
	pin := &cobra.Command{
		Use: "pin STATE...", Short: "Keep states (and their ancestors) past their env's close and the retention, until unpin", Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: stateIDs("pinned", (*arbor.Client).Pin),
	}
	unpin := &cobra.Command{
		Use: "unpin STATE...", Short: "Undo pin", Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: stateIDs("unpinned", (*arbor.Client).Unpin),
	}
	release := &cobra.Command{
		Use: "release STATE...", Short: "Let the server delete states you will not branch from again", Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: stateIDs("released", (*arbor.Client).Release),
	}
	var p arbor.TasksParams
	tasks := &cobra.Command{
		Use: "tasks [--dataset NAME] [--limit N] [--cursor C]", Short: "List the server's tasks, or a dataset's instances, a page at a time", Args: usageArgs(cobra.NoArgs),
		RunE: call(func(ctx context.Context, cl *arbor.Client, _ []string) (any, error) {
			r, err := cl.Tasks(ctx, p)
			return tasksResult{r}, err
		}),
	}
	tasks.Flags().StringVar(&p.Dataset, "dataset", "", "list this dataset's instances")
	tasks.Flags().IntVar(&p.Limit, "limit", 0, "most tasks on the page (default: the server's, 100)")
	tasks.Flags().StringVar(&p.Cursor, "cursor", "", "the page after the one that printed this cursor")
	return []*cobra.Command{promote, discard, prepare, pin, unpin, release, tasks}
}
