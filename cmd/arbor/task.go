package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/envpool"
)

func init() { subcommands = append(subcommands, taskCommand) }

// taskCommand is `arbor task`: tools for task files (docs/tasks.md).
func taskCommand(*globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Work with task files and datasets (docs/tasks.md)"}
	var image, out, name string
	imp := &cobra.Command{
		Use:   "import DIR --image REF",
		Short: "Import a terminal-task directory (task.yaml or instruction.md, tests/, a runner, a solution) as a task with hidden tests",
		Long: `Import a task directory in the layout terminal-agent benchmarks publish:
task.yaml + run-tests.sh + tests/ (+ solution.sh), or instruction.md +
tests/test.sh (+ solution/solve.sh). The image is an OCI reference (the
directory's Dockerfile is not built here). Writes OUT/NAME.yaml and the
tests as its hidden files in OUT/NAME/, copied to /tests only when the task
is graded (docs/tasks.md, "Terminal-task directories").`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if image == "" {
				return fmt.Errorf("--image is required: the task's OCI image reference (the Dockerfile is not built here)")
			}
			tt, err := envpool.ImportTerminalTask(args[0], image, name)
			if err != nil {
				return err
			}
			file, err := envpool.WriteTerminalTask(tt, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "wrote %s (hidden tests in %s/)\n", file, tt.Task.Name)
			return nil
		},
	}
	imp.Flags().StringVar(&image, "image", "", "the task's image: an OCI reference or a local image name")
	imp.Flags().StringVar(&out, "out", "tasks", "the task directory to write into")
	imp.Flags().StringVar(&name, "name", "", "the task's name (default: the directory's)")
	cmd.AddCommand(imp)
	return cmd
}
