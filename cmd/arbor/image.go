package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/arbor-env/arbor/doctor"
	"github.com/arbor-env/arbor/image"
)

// registryFlags are how image pull and serve reach OCI registries
// (docs/images.md, "Pulling").
type registryFlags struct {
	insecure []string
	auth     []string
}

func (r *registryFlags) add(f *pflag.FlagSet) {
	f.StringSliceVar(&r.insecure, "insecure-registry", splitList(os.Getenv("ARBOR_INSECURE_REGISTRIES")),
		"registry (host or host:port) that may be reached over plain HTTP; loopback registries always may (env ARBOR_INSECURE_REGISTRIES, comma-separated)")
	f.StringSliceVar(&r.auth, "registry-auth", splitList(os.Getenv("ARBOR_REGISTRY_AUTH")),
		"HOST=USER:PASSWORD credentials for a registry, before the Docker config file's (env ARBOR_REGISTRY_AUTH, comma-separated; the env keeps them out of ps)")
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// pullFromFlag is --pull-from as image.Registry.PullFrom: nil for any
// ("*"), else the hosts (an empty list: none).
func pullFromFlag(hosts []string) []string {
	if slices.Contains(hosts, "*") {
		return nil
	}
	return append([]string{}, hosts...)
}

// registry is the image.Registry the flags describe.
func (r *registryFlags) registry() (image.Registry, error) {
	reg := image.Registry{Insecure: r.insecure}
	for _, a := range r.auth {
		host, cred, ok := strings.Cut(a, "=")
		user, pass, ok2 := strings.Cut(cred, ":")
		if !ok || !ok2 || host == "" || user == "" {
			return reg, fmt.Errorf("--registry-auth %q: want HOST=USER:PASSWORD", strings.SplitN(a, ":", 2)[0]+":...")
		}
		if reg.Auth == nil {
			reg.Auth = map[string]authn.AuthConfig{}
		}
		reg.Auth[host] = authn.AuthConfig{Username: user, Password: pass}
	}
	return reg, nil
}

func init() { subcommands = append(subcommands, newImageCmd) }

func newImageCmd(g *globalOptions) *cobra.Command {
	var cacheDir string
	var regFlags registryFlags
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Pull, build, import, list and remove images (docs/images.md)",
	}
	cmd.PersistentFlags().StringVar(&cacheDir, "cache-dir", envOr("ARBOR_IMAGE_CACHE", image.DefaultCacheDir),
		"build cache (cached rootfs tarballs, downloaded .debs), shared by every state dir")
	regFlags.add(cmd.PersistentFlags())
	open := func(cmd *cobra.Command) (*image.Store, error) {
		reg, err := regFlags.registry()
		if err != nil {
			return nil, err
		}
		snap, err := openSnapshotter(cmd.Context(), g)
		if err != nil {
			return nil, err
		}
		return &image.Store{Snap: snap, CacheDir: cacheDir, Registry: reg}, nil
	}

	pull := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from an OCI registry (tag or @sha256: digest); its layers are stored once",
		Example: `  arbor image pull 127.0.0.1:5000/swe/django-1234:latest
  arbor image pull --insecure-registry registry.lan:5000 registry.lan:5000/envs/py@sha256:...`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open(cmd)
			if err != nil {
				return err
			}
			start := time.Now()
			in, err := s.Pull(cmd.Context(), args[0], cmd.OutOrStdout())
			if err != nil {
				return err
			}
			return reportMade(cmd, s, in.Name, start)
		},
	}

	var force, cacheOnly bool
	var recipesDir string
	// makeImage opens the store, removes image name first when --force
	// asks for that, makes it with fn and reports what it made.
	makeImage := func(cmd *cobra.Command, name string, fn func(s *image.Store) error) error {
		s, err := open(cmd)
		if err != nil {
			return err
		}
		if force {
			if _, err := s.Get(cmd.Context(), name); err == nil {
				if err := s.Remove(cmd.Context(), name); err != nil {
					return err
				}
			} else if !errors.Is(err, image.ErrNotFound) {
				return err
			}
		}
		start := time.Now()
		if err := fn(s); err != nil {
			return err
		}
		return reportMade(cmd, s, name, start)
	}
	build := &cobra.Command{
		Use: "build NAME",
		Short: "Build an image from a built-in recipe, busybox (seconds) or debian (cached after the first build), " +
			"or from its recipe file DIR/NAME.yaml (--recipes DIR; built again only when it or its files or base changed)",
		Example: `  arbor image build debian
  arbor image build debian-build          # images/debian-build.yaml
  arbor image build --recipes envs swe-py # envs/swe-py.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name := args[0]; !slices.Contains(image.Recipes, name) && !cacheOnly {
				p := filepath.Join(recipesDir, name+".yaml")
				if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("build %s: %w (built-in: %s) and no recipe file %s (--recipes, ARBOR_RECIPES)",
						name, image.ErrUnknownRecipe, strings.Join(image.Recipes, ", "), p)
				}
				return makeImage(cmd, name, func(s *image.Store) error {
					_, err := s.BuildRecipe(cmd.Context(), name, p, cmd.OutOrStdout())
					return err
				})
			}
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
			return makeImage(cmd, args[0], func(s *image.Store) error {
				return s.Build(cmd.Context(), args[0], cmd.OutOrStdout())
			})
		},
	}
	build.Flags().BoolVar(&force, "force", false, "remove an existing image of that name first (a recipe image is rebuilt even when up to date)")
	build.Flags().StringVar(&recipesDir, "recipes", envOr("ARBOR_RECIPES", "images"),
		"folder of recipe files: NAME.yaml builds image NAME (env ARBOR_RECIPES; docs/images.md, \"Recipes\")")
	build.Flags().BoolVar(&cacheOnly, "cache-only", false,
		"only fill the build cache (debian: the rootfs tarball) when it is missing; needs no state dir")

	imp := &cobra.Command{
		Use:   "import NAME DIR|TARBALL",
		Short: "Make an image from a docker save archive, an OCI layout (directory or tar), a directory tree or a rootfs tarball (tar, tar.gz, tar.xz, tar.zst)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return makeImage(cmd, args[0], func(s *image.Store) error {
				return s.Import(cmd.Context(), args[0], args[1], cmd.OutOrStdout())
			})
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
			shared := image.Shared(infos)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tSHARED\tLAYERS\tDIGEST\tREFS\tCREATED\tSOURCE")
			for _, in := range infos {
				created := "-"
				if !in.Created.IsZero() {
					created = in.Created.Local().Format("2006-01-02 15:04")
				}
				digest, refs := "-", strings.Join(s.Refs(in.Name), ",")
				if in.Digest != "" {
					digest = in.Digest[:min(len(in.Digest), 19)]
				}
				if refs == "" {
					refs = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", in.Name, doctor.HumanBytes(uint64(in.Size)), doctor.HumanBytes(uint64(shared[in.Name])),
					len(in.Layers), digest, refs, created, in.Source)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	rm := &cobra.Command{
		Use:   "rm NAME|REF...",
		Short: "Remove images (by local name or by the reference they were pulled as) and the layers no other image uses",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open(cmd)
			if err != nil {
				return err
			}
			for _, ref := range args {
				in, err := s.Resolve(cmd.Context(), ref, false, nil)
				if err != nil {
					return err
				}
				if err := s.Remove(cmd.Context(), in.Name); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "removed", in.Name)
			}
			return nil
		},
	}

	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove the stored layers no image uses (left by failed pulls)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := open(cmd)
			if err != nil {
				return err
			}
			n, err := s.PruneLayers(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d layers\n", n)
			return nil
		},
	}

	cmd.AddCommand(pull, build, imp, ls, rm, prune)
	return cmd
}

func reportMade(cmd *cobra.Command, s *image.Store, name string, start time.Time) error {
	in, err := s.Get(cmd.Context(), name)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "image %s: %s, shell %s, made in %s\n",
		in.Name, doctor.HumanBytes(uint64(in.Size)), in.Shell, time.Since(start).Round(time.Millisecond))
	return nil
}
