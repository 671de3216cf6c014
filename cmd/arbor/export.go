package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	arbor "github.com/arbor-env/arbor/clients/go"
)

// newEnvExportCmd is arbor env export: a trajectory as JSONL.
func newEnvExportCmd(o *envOptions) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export ENV_OR_STATE [-o FILE]",
		Short: "Write the path from the root to an env's head or a state as JSONL, one turn per line",
		Long: `Writes the trajectory the server recorded (protocol trajectory): one JSON object
per turn, oldest first, with the action as sent, the observation (stdout and
stderr as the server kept them), the state it led to, its checkpoint kind, the
reward of the newest evaluate of that state if any, and the turn's timings.
An env id exports the path to its head; a state id (of an open env or of a
closed one the server still retains) the path to that state. The output is
always JSONL: here -o/--output names a file, not a format.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(c.Context(), o.timeout)
			defer cancel()
			cl, err := o.dial(ctx)
			if err != nil {
				return err
			}
			defer cl.Close()
			t, err := exportTrajectory(ctx, cl, args[0])
			if err != nil {
				return exitOf(err)
			}
			w := io.Writer(os.Stdout)
			var f *os.File
			if out != "" && out != "-" {
				if f, err = os.Create(out); err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if err := writeJSONL(w, t.Turns); err != nil {
				return fmt.Errorf("write %s: %w", out, err)
			}
			if f != nil {
				if err := f.Close(); err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "wrote %d turns (root %s to state %s) to %s\n", len(t.Turns), t.Root, t.StateID, out)
			}
			if len(t.Missing) > 0 {
				fmt.Fprintf(os.Stderr, "arbor: the server has no record of the turns that led to %s\n", strings.Join(t.Missing, ", "))
			}
			return nil
		},
	}
	// Its output is JSONL whatever the format: -o here names a file.
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of stdout")
	return cmd
}

// exportTrajectory asks for id's trajectory as an env's, then as a
// state's.
func exportTrajectory(ctx context.Context, cl *arbor.Client, id string) (*arbor.TrajectoryResult, error) {
	t, err := cl.Trajectory(ctx, id)
	if !errors.Is(err, arbor.ErrUnknownEnv) {
		return t, err
	}
	t, err = cl.StateTrajectory(ctx, id)
	if errors.Is(err, arbor.ErrUnknownState) {
		return nil, fmt.Errorf("%q is neither an open env nor a state the server holds: %w", id, err)
	}
	return t, err
}

// writeJSONL writes one JSON object per turn.
func writeJSONL(w io.Writer, turns []arbor.TrajectoryTurn) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range turns {
		if err := enc.Encode(&turns[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}
