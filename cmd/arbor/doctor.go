package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/doctor"
)

func init() { subcommands = append(subcommands, newDoctorCmd) }

// errDoctor is returned (exit 2) when a required capability is missing.
var errDoctor = errors.New("a required capability is missing")

func newDoctorCmd(g *globalOptions) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "check this host for what Arbor needs and say how to fix what is missing",
		Long: `doctor checks root, CRIU (binary, version >= 4.0, criu check, a real dump),
btrfs, ZFS tools (required with --backend zfs, which makes btrfs optional), bpf() with a syscall tracepoint (mounting tracefs when it is
not mounted), the cgroup v2 tree and v1 controllers, soft-dirty tracking and
free space in the state dir. It exits 2 when a required check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := doctor.Run(cmd.Context(), doctor.NewHost(), doctor.Options{CRIUFlag: g.criuPath, StateDir: g.stateDir,
				Backend: g.backend, ZFSDataset: os.Getenv("ARBOR_ZFS_DATASET")})
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(r); err != nil {
					return fmt.Errorf("write report: %w", err)
				}
			} else if err := writeDoctorTable(out, r); err != nil {
				return fmt.Errorf("write report: %w", err)
			}
			if !r.OK {
				return &exitError{code: 2, err: errDoctor}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as a JSON object")
	return cmd
}

// writeDoctorTable prints one aligned row per check and, under a check
// that is not ok, its remedy.
func writeDoctorTable(w io.Writer, r doctor.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
	for _, c := range r.Checks {
		name := c.Name
		if !c.Required {
			name += " (optional)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, strings.ToUpper(string(c.Status)), c.Detail)
		if c.Status != doctor.OK && c.Remedy != "" {
			fmt.Fprintf(tw, "\t\t-> %s\n", c.Remedy)
		}
	}
	return tw.Flush()
}
