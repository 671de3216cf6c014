package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/image"
)

func init() { subcommands = append(subcommands, newImageCmd) }

func newImageCmd(g *globalOptions) *cobra.Command {
	var cacheDir string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build, import, list and remove root filesystem images",
	}
	cmd.PersistentFlags().StringVar(&cacheDir, "cache-dir", envOr("ARBOR_IMAGE_CACHE", image.DefaultCacheDir),
		"build cache (cached rootfs tarballs, downloaded .debs), shared by every state dir")
	open := func(cmd *cobra.Command) (*image.Store, error) {
		snap, err := openSnapshotter(cmd.Context(), g)
		if err != nil {
			return nil, err
		}
		return &image.Store{Snap: snap, CacheDir: cacheDir}, nil
	}

	var force, cacheOnly bool
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build an image from a built-in recipe: busybox (seconds) or debian (cached after the first build)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cacheOnly {
				if args[0] != "debian" {
					return fmt.Errorf("--cache-only: only the debian recipe has a build cache")
				}
				p, err := (&image.Store{CacheDir: cacheDir}).CacheDebian(cmd.Context(), cmd.OutOrStdout())
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "debian rootfs cached at %s\n", p)
				return nil
			}
			s, err := open(cmd)
			if err != nil {
				return err
			}
			if err := removeIfForced(cmd, s, args[0], force); err != nil {
				return err
			}
			start := time.Now()
			if err := s.Build(cmd.Context(), args[0], cmd.OutOrStdout()); err != nil {
				return err
			}
			return reportMade(cmd, s, args[0], start)
		},
	}
	build.Flags().BoolVar(&force, "force", false, "remove an existing image of that name first")
	build.Flags().BoolVar(&cacheOnly, "cache-only", false,
		"only fill the build cache (debian: the rootfs tarball) when it is missing; needs no state dir")

	imp := &cobra.Command{
		Use:   "import NAME DIR|TARBALL",
		Short: "Make an image from a directory tree or a tarball (tar, tar.gz, tar.xz, tar.zst)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open(cmd)
			if err != nil {
				return err
			}
			if err := removeIfForced(cmd, s, args[0], force); err != nil {
				return err
			}
			start := time.Now()
			if err := s.Import(cmd.Context(), args[0], args[1], cmd.OutOrStdout()); err != nil {
				return err
			}
			return reportMade(cmd, s, args[0], start)
		},
	}
	imp.Flags().BoolVar(&force, "force", false, "remove an existing image of that name first")

	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := open(cmd)
			if err != nil {
				return err
			}
			infos, err := s.List(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if infos == nil {
					infos = []image.Info{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(infos)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tSHELL\tCREATED\tSOURCE")
			for _, in := range infos {
				created := "-"
				if !in.Created.IsZero() {
					created = in.Created.Local().Format("2006-01-02 15:04")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", in.Name, humanSize(in.Size), in.Shell, created, in.Source)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove images",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open(cmd)
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := s.Remove(cmd.Context(), name); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "removed", name)
			}
			return nil
		},
	}

	cmd.AddCommand(build, imp, ls, rm)
	return cmd
}

// removeIfForced removes image name before it is made again, when --force
// asks for that.
func removeIfForced(cmd *cobra.Command, s *image.Store, name string, force bool) error {
	if !force {
		return nil
	}
	if _, err := s.Get(cmd.Context(), name); errors.Is(err, image.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	return s.Remove(cmd.Context(), name)
}

func reportMade(cmd *cobra.Command, s *image.Store, name string, start time.Time) error {
	in, err := s.Get(cmd.Context(), name)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "image %s: %s, shell %s, made in %s\n",
		in.Name, humanSize(in.Size), in.Shell, time.Since(start).Round(time.Millisecond))
	return nil
}

func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
