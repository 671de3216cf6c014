package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/cluster"
)

func init() { subcommands = append(subcommands, newNodeCmd) }

// newNodeCmd is arbor node: operations on a cluster node.
func newNodeCmd(_ *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Operate a node of a cluster (docs/cluster.md)"}
	var (
		token   string
		timeout time.Duration
	)
	drain := &cobra.Command{
		Use:   "drain HOST:PORT",
		Short: "Move every env of the node at HOST:PORT (its --advertise address) to other nodes",
		Long: `Drain a node (arbor serve --cluster-etcd): it is published as draining (no new
env is placed on it) and migrates its envs one by one to the least loaded other
nodes, as migrate does; requests for them meanwhile wait and complete on their
new nodes. Prints what moved and what could not.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			ds, err := cluster.NewShipClient(token, timeout).Drain(c.Context(), args[0], timeout)
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			enc.Encode(ds)
			if err != nil {
				return fmt.Errorf("node drain: %w", err)
			}
			return nil
		},
	}
	drain.Flags().StringVar(&token, "token", envOr("ARBOR_TOKEN", ""), "the node's token (env ARBOR_TOKEN)")
	drain.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long (the envs not moved by then stay)")
	cmd.AddCommand(drain)
	return cmd
}
