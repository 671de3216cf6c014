package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"gopkg.in/yaml.v3"

	"github.com/arbor-env/arbor/cr"
)

// ErrBadRecipe is wrapped when a recipe file cannot be built as written:
// not valid YAML, an unknown field, a relative dst, a missing src file, a
// package name that is not one.
var ErrBadRecipe = errors.New("bad image recipe")

// ErrRecipeStep is wrapped when a step of a recipe build fails: a run
// command exits non-zero or times out, apt-get cannot install the packages.
var ErrRecipeStep = errors.New("recipe step failed")

// DefaultRecipeTimeout bounds each run command and the package install of
// a recipe that sets no timeout.
const DefaultRecipeTimeout = 30 * time.Minute

// Recipe is an image recipe file (docs/images.md, "Recipes"): a base
// image and what to add to it. A build does, in this order: packages,
// files, run; then applies env, workdir and user to the image config.
type Recipe struct {
	// Base is a local image name (built-in ones are built on first use)
	// or an OCI registry reference, pulled when missing.
	Base string `yaml:"base" json:"base"`
	// Packages are Debian package names installed with apt-get from the
	// host's own apt source.
	Packages []string `yaml:"packages,omitempty" json:"packages,omitempty"`
	// Files are copied into the image.
	Files []RecipeFile `yaml:"files,omitempty" json:"files,omitempty"`
	// Run are shell commands run as root in the image, in order.
	Run []string `yaml:"run,omitempty" json:"run,omitempty"`
	// Env entries (KEY=VALUE) are added to the image config's env.
	Env []string `yaml:"env,omitempty" json:"env,omitempty"`
	// Workdir is the image config's working directory.
	Workdir string `yaml:"workdir,omitempty" json:"workdir,omitempty"`
	// User is the image config's user ("name", "uid", "name:group").
	User string `yaml:"user,omitempty" json:"user,omitempty"`
	// Labels are added to the image config's labels (a key replaces the
	// base's): LabelOtherUsers, for one.
	Labels map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	// Timeout bounds each run command and the package install (a Go
	// duration, "10m"); DefaultRecipeTimeout when empty.
	Timeout string `yaml:"timeout,omitempty" json:"-"`

	path    string        // the recipe file, absolute
	timeout time.Duration // Timeout parsed
}

// RecipeFile is one file or directory a recipe copies into its image.
type RecipeFile struct {
	// Src is relative to the recipe file's folder and stays inside it.
	Src string `yaml:"src" json:"src"`
	// Dst is the absolute path in the image. A file is copied into
	// directory Dst when Dst ends in "/" or is a directory in the image; a
	// directory src's content is copied into the directory Dst.
	Dst string `yaml:"dst" json:"dst"`
	// Mode is the octal mode of a file ("0644"); the src file's mode
	// when empty.
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`

	mode os.FileMode // Mode parsed; 0 when unset
	dir  bool        // src is a directory
}

// debPackageRE is Debian policy's package name (5.6.7): lower-case
// letters, digits, '+', '-', '.', at least two, starting alphanumeric.
var debPackageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// LoadRecipe reads and checks the recipe file at p. Every problem is an
// error wrapping ErrBadRecipe that names the file and the field.
func LoadRecipe(p string) (*Recipe, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadRecipe, p, err)
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", ErrBadRecipe, p, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var r Recipe
	if err := dec.Decode(&r); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %s: empty file", ErrBadRecipe, p)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrBadRecipe, p, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s: more than one YAML document", ErrBadRecipe, p)
	}
	r.path = abs
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadRecipe, p, err)
	}
	return &r, nil
}

// validate checks and normalizes a decoded recipe; its errors are
// wrapped in ErrBadRecipe by LoadRecipe.
func (r *Recipe) validate() error {
	switch {
	case r.Base == "":
		return errors.New("base: missing (a local image name or a registry reference)")
	case IsReference(r.Base):
		if _, err := parseReference(r.Base); err != nil {
			return fmt.Errorf("base: %w", err)
		}
	default:
		if err := ValidName(r.Base); err != nil {
			return fmt.Errorf("base: %w", err)
		}
	}
	for i, p := range r.Packages {
		if !debPackageRE.MatchString(p) {
			return fmt.Errorf("packages[%d]: %q is not a Debian package name (no versions, options or spaces)", i, p)
		}
	}
	slices.Sort(r.Packages)
	r.Packages = slices.Compact(r.Packages)
	dir := filepath.Dir(r.path)
	for i := range r.Files {
		if err := r.Files[i].validate(dir); err != nil {
			return fmt.Errorf("files[%d]: %w", i, err)
		}
	}
	for i, c := range r.Run {
		if strings.TrimSpace(c) == "" || strings.ContainsRune(c, 0) {
			return fmt.Errorf("run[%d]: empty command", i)
		}
	}
	for i, e := range r.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.ContainsAny(k, " \t\n") || strings.ContainsRune(e, 0) {
			return fmt.Errorf("env[%d]: %q is not KEY=VALUE", i, e)
		}
	}
	if r.Workdir != "" {
		if !path.IsAbs(r.Workdir) {
			return fmt.Errorf("workdir: %q is not absolute", r.Workdir)
		}
		r.Workdir = path.Clean(r.Workdir)
	}
	if strings.ContainsAny(r.User, " \t\n\x00") {
		return fmt.Errorf("user: %q is not a user (name, uid, name:group)", r.User)
	}
	for k, v := range r.Labels {
		if k == "" || strings.ContainsAny(k, " \t\n\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("labels: %q is not a label key", k)
		}
	}
	r.timeout = DefaultRecipeTimeout
	if r.Timeout != "" {
		d, err := time.ParseDuration(r.Timeout)
		if err != nil || d <= 0 {
			return fmt.Errorf("timeout: %q is not a positive duration (10m, 1h)", r.Timeout)
		}
		r.timeout = d
	}
	return nil
}

// validate checks one files entry against the recipe's folder dir.
func (f *RecipeFile) validate(dir string) error {
	if f.Src == "" || f.Dst == "" {
		return errors.New("src and dst are both required")
	}
	if filepath.IsAbs(f.Src) {
		return fmt.Errorf("src %q is absolute: it is relative to the recipe's folder", f.Src)
	}
	if c := filepath.Clean(f.Src); c == ".." || strings.HasPrefix(c, "../") {
		return fmt.Errorf("src %q is outside the recipe's folder", f.Src)
	}
	if !path.IsAbs(f.Dst) {
		return fmt.Errorf("dst %q is not absolute", f.Dst)
	}
	into := strings.HasSuffix(f.Dst, "/")
	f.Dst = path.Clean(f.Dst)
	if f.Dst == "/" || f.Dst == MetadataPath {
		return fmt.Errorf("dst %q: not a place to copy to", f.Dst)
	}
	if into {
		f.Dst += "/" // a directory to copy into, made when missing
	}
	st, err := os.Stat(filepath.Join(dir, f.Src))
	if err != nil {
		return fmt.Errorf("src %q: %w", f.Src, err)
	}
	switch {
	case st.IsDir():
		f.dir = true
	case !st.Mode().IsRegular():
		return fmt.Errorf("src %q is neither a file nor a directory", f.Src)
	}
	if f.Mode != "" {
		if f.dir {
			return fmt.Errorf("mode: src %q is a directory (its files keep their modes)", f.Src)
		}
		m, err := strconv.ParseUint(strings.TrimPrefix(f.Mode, "0o"), 8, 32)
		if err != nil || m > 0o7777 {
			return fmt.Errorf("mode %q is not an octal file mode (\"0644\")", f.Mode)
		}
		f.mode = fileModeOf(uint32(m))
		f.Mode = fmt.Sprintf("%04o", m) // one spelling for the key
	}
	return nil
}

// fileModeOf turns Unix permission bits (set-id and sticky included) into
// an os.FileMode.
func fileModeOf(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// src is the host path of a files entry.
func (r *Recipe) src(f RecipeFile) string { return filepath.Join(filepath.Dir(r.path), f.Src) }

// baseIdentity names exactly the tree of an image a recipe builds on: its
// manifest digest, else its top layer's chain, else its name and when it
// was made (built-in and imported images).
func baseIdentity(base Info) string {
	switch {
	case base.Digest != "":
		return "digest " + base.Digest
	case len(base.Layers) > 0:
		return "chain " + base.Layers[len(base.Layers)-1].Chain
	}
	return "image " + base.Name + " " + base.Created.UTC().Format(time.RFC3339Nano)
}

// key is the recipe's cache key, hex sha256 of what the image is made of:
// the normalized recipe, the content and mode of every file it copies and
// the identity of its base image. An image built with the same key is up
// to date.
func (r *Recipe) key(base Info) (string, error) {
	h := sha256.New()
	norm, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "arbor recipe v1\n%s\nbase %s\n", norm, baseIdentity(base))
	for i, f := range r.Files {
		fmt.Fprintf(h, "file %d\n", i)
		if err := hashTree(h, r.src(f), f.mode); err != nil {
			return "", fmt.Errorf("files[%d]: %w", i, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashTree writes to h the name, type, permissions and content (a link's
// target) of every entry of the tree at root, in lexical order; mode,
// when set, stands for a single file's own.
func hashTree(h io.Writer, root string, mode os.FileMode) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		m := fi.Mode()
		if p == root && mode != 0 {
			m = m.Type() | mode
		}
		fmt.Fprintf(h, "%q %s %d\n", rel, m, fi.Size())
		switch {
		case m&os.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "-> %q\n", t)
		case m.IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return fmt.Errorf("read %s: %w", p, err)
			}
		}
		return nil
	})
}

// mergeEnv returns base with each KEY=VALUE of add replacing base's entry
// for KEY, or appended.
func mergeEnv(base, add []string) []string {
	out := slices.Clone(base)
	for _, e := range add {
		k, _, _ := strings.Cut(e, "=")
		if i := slices.IndexFunc(out, func(o string) bool { return strings.HasPrefix(o, k+"=") }); i >= 0 {
			out[i] = e
		} else {
			out = append(out, e)
		}
	}
	return out
}

// config is the base's config with the recipe's env, workdir, user and
// labels applied, its user resolved in the tree at root as an OCI image's is
// (configFrom); nil when neither says anything.
func (r *Recipe) config(base *Config, root string) (*Config, error) {
	if base == nil && len(r.Env) == 0 && r.Workdir == "" && r.User == "" && len(r.Labels) == 0 {
		return nil, nil
	}
	var b Config
	if base != nil {
		b = *base
	}
	oc := v1.Config{Env: mergeEnv(b.Env, r.Env), WorkingDir: b.WorkingDir, User: b.User,
		Labels: b.Labels, Entrypoint: b.Entrypoint, Cmd: b.Cmd}
	if r.Workdir != "" {
		oc.WorkingDir = r.Workdir
	}
	if r.User != "" {
		oc.User = r.User
	}
	if len(r.Labels) > 0 {
		oc.Labels = maps.Clone(b.Labels)
		if oc.Labels == nil {
			oc.Labels = map[string]string{}
		}
		maps.Copy(oc.Labels, r.Labels)
	}
	return configFrom(&v1.ConfigFile{Config: oc}, root)
}

// recipeBase returns the image a recipe builds on: a built-in one is
// built when missing (Ensure), a registry reference pulled (Resolve).
func (s *Store) recipeBase(ctx context.Context, base string, progress io.Writer) (Info, error) {
	if slices.Contains(Recipes, base) {
		return s.Ensure(ctx, base, progress)
	}
	return s.Resolve(ctx, base, true, progress)
}

// BuildRecipe makes image name from the recipe file at recipePath
// (docs/images.md, "Recipes") and returns it. The build is one layer on
// top of the base image's layers, snapshot layers/<chain> whose chain ID
// comes from the base's top layer and the recipe's cache key (Recipe.key),
// so an image already built with that key is returned as it is, and one
// built from an older recipe, other files or another base is replaced
// (once the new layer is built: a failed rebuild keeps the old image).
// An image name that was not made by a recipe is not replaced
// (ErrExists). Nothing of a failed build is left behind. Progress,
// including the output of apt-get and the run commands, goes to progress.
func (s *Store) BuildRecipe(ctx context.Context, name, recipePath string, progress io.Writer) (Info, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := ValidName(name); err != nil {
		return Info{}, err
	}
	if slices.Contains(Recipes, name) {
		return Info{}, fmt.Errorf("%w: %s is a built-in image's name", ErrBadRecipe, name)
	}
	r, err := LoadRecipe(recipePath)
	if err != nil {
		return Info{}, err
	}
	if r.Base == name {
		return Info{}, fmt.Errorf("%w: %s: the base is the image itself", ErrBadRecipe, recipePath)
	}
	base, err := s.recipeBase(ctx, r.Base, progress)
	if err != nil {
		return Info{}, fmt.Errorf("recipe %s: base %s: %w", recipePath, r.Base, err)
	}
	key, err := r.key(base)
	if err != nil {
		return Info{}, fmt.Errorf("%w: %s: %w", ErrBadRecipe, recipePath, err)
	}
	old, err := s.Get(ctx, name)
	switch {
	case err == nil && old.Recipe == key:
		fmt.Fprintf(progress, "recipe %s: image %s is up to date\n", name, name)
		return old, nil
	case err == nil && old.Recipe == "":
		return Info{}, fmt.Errorf("build image %s: %w and was not made from a recipe (remove it first)", name, ErrExists)
	case err != nil && !errors.Is(err, ErrNotFound):
		return Info{}, err
	}
	replace := err == nil
	log := s.logger().With(slog.String("image", name), slog.String("recipe", r.path))
	start := time.Now()
	layer, err := s.recipeLayer(ctx, name, r, base, key, progress)
	if err != nil {
		return Info{}, fmt.Errorf("build image %s from %s: %w", name, recipePath, err)
	}
	if replace {
		if err := s.dropImage(ctx, name); err != nil {
			return Info{}, fmt.Errorf("replace image %s: %w", name, err)
		}
		log.Info("replacing recipe image", slog.String("old_key", old.Recipe), slog.String("key", key))
	}
	layers := append(slices.Clone(base.Layers), layer)
	fill := func(ctx context.Context, root string, _ io.Writer) (metadata, error) {
		c, err := r.config(base.Config, root)
		if err != nil {
			return metadata{}, fmt.Errorf("%w: %s: %w", ErrBadRecipe, recipePath, err)
		}
		return metadata{Source: "recipe " + r.path + " on " + base.Name, Layers: layers, Config: c, Recipe: key}, nil
	}
	err = s.create(ctx, name, LayerSnapshot(layer.Chain), fill, progress)
	if errors.Is(err, ErrExists) {
		// Another build of the same recipe won the race.
		if in, gerr := s.Get(ctx, name); gerr == nil && in.Recipe == key {
			return in, nil
		}
	}
	if err != nil {
		return Info{}, err
	}
	if replace {
		if _, err := s.PruneLayers(ctx); err != nil {
			log.Warn("prune layers of the replaced image", slog.Any("err", err))
		}
	}
	log.Info("recipe image built", slog.String("key", key), slog.Int64("added", layer.Unpacked),
		slog.Duration("took", time.Since(start)))
	return s.Get(ctx, name)
}

// dropImage removes image name as Remove does but keeps the layers: the
// one a rebuild just made is used by no image until the new one exists.
func (s *Store) dropImage(ctx context.Context, name string) error {
	if err := s.Snap.Destroy(ctx, SnapshotName(name)); err != nil && !errors.Is(err, cr.ErrNotFound) {
		return err
	}
	if err := s.removeShifted(ctx, name); err != nil {
		return fmt.Errorf("shifted copies: %w", err)
	}
	return s.forgetRefs(name)
}

// recipeLayer returns the layer a recipe with key adds to base, building
// it (buildRecipeLayer) unless the store has it; concurrent builds of one
// layer in this process share one build.
func (s *Store) recipeLayer(ctx context.Context, name string, r *Recipe, base Info, key string, progress io.Writer) (Layer, error) {
	parent := ""
	if len(base.Layers) > 0 {
		parent = base.Layers[len(base.Layers)-1].Chain
	}
	lay := Layer{Chain: chainID(parent, "sha256:"+key), DiffID: "sha256:" + key}
	if rec, err := s.layerRecord(lay.Chain); err == nil && s.hasSnapshot(ctx, LayerSnapshot(lay.Chain)) {
		fmt.Fprintf(progress, "recipe %s: layer %s already built\n", name, short(lay.Chain))
		lay.Unpacked = rec.Unpacked
		return lay, nil
	}
	v, err, _ := layerBuilds.Do(s.Snap.Path(LayerSnapshot(lay.Chain)), func() (any, error) {
		return s.buildRecipeLayer(ctx, name, r, base, lay, progress)
	})
	if err != nil {
		return Layer{}, err
	}
	lay.Unpacked = v.(int64)
	return lay, nil
}

// buildRecipeLayer clones base into a build volume, installs the
// recipe's packages, copies its files, runs its commands and snapshots
// the result as layer lay, returning the bytes it added. A failure
// destroys the build volume (and what was mounted in it).
func (s *Store) buildRecipeLayer(ctx context.Context, name string, r *Recipe, base Info, lay Layer, progress io.Writer) (added int64, err error) {
	log := s.logger().With(slog.String("image", name))
	s.cleanStaleBuilds(ctx)
	tmp, done, err := s.newBuild(ctx, log, "recipe", base.Snapshot)
	if err != nil {
		return 0, fmt.Errorf("clone base %s: %w", base.Name, err)
	}
	defer done()
	root := s.Snap.Path(tmp)
	// The base's metadata is the base's, not the layer's.
	if err := os.Remove(filepath.Join(root, MetadataPath)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("clear base metadata: %w", err)
	}
	fmt.Fprintf(progress, "recipe %s: on %s (%s)\n", name, base.Name, baseIdentity(base))
	if err := s.runRecipeSteps(ctx, name, r, base, root, progress); err != nil {
		return 0, err
	}
	// Fail here, before the layer exists, on a user the tree lacks.
	if _, err := r.config(base.Config, root); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrBadRecipe, err)
	}
	if _, err := findShell(root); err != nil {
		return 0, err
	}
	size, err := diskUsage(root)
	if err != nil {
		return 0, err
	}
	added = max(0, size-base.Size)
	if err := s.Snap.Snapshot(ctx, tmp, LayerSnapshot(lay.Chain)); err != nil && !errors.Is(err, cr.ErrExists) {
		return 0, fmt.Errorf("snapshot layer: %w", err)
	}
	lay.Unpacked = added
	if err := s.writeLayerRecord(layerRecord{Layer: lay, Created: time.Now().UTC()}); err != nil {
		return 0, fmt.Errorf("record layer: %w", err)
	}
	return added, nil
}

// copyFiles copies the recipe's files into the tree at root, owned
// by root, each path resolved inside root as a chroot would.
func (r *Recipe) copyFiles(root string, progress io.Writer) error {
	for i, f := range r.Files {
		src := r.src(f)
		var err error
		if f.dir {
			err = copyDirInto(src, root, f.Dst)
		} else {
			err = copyFileInto(src, root, f.Dst, f.mode)
		}
		if err != nil {
			return fmt.Errorf("files[%d] %s -> %s: %w", i, f.Src, f.Dst, err)
		}
		fmt.Fprintf(progress, "  copied %s -> %s\n", f.Src, f.Dst)
	}
	return nil
}

// placeIn returns the host path of in-image path p inside root: its
// parent resolved as a chroot would, its last component not followed (a
// symlink there is replaced, not written through).
func placeIn(root, p string) (string, error) {
	dir, err := resolveIn(root, path.Dir(p))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(p)), nil
}

// mkdirIn makes in-image directory p and its missing parents (0755).
func mkdirIn(root, p string) error {
	cur := "/"
	for _, c := range strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/") {
		if c == "" {
			continue
		}
		cur = path.Join(cur, c)
		hp, err := resolveIn(root, cur)
		if err != nil {
			return err
		}
		st, err := os.Stat(hp)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(hp, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case !st.IsDir():
			return fmt.Errorf("%s is not a directory", cur)
		}
	}
	return nil
}

// copyFileInto copies the host file src to in-image path dst (into it,
// when dst ends in "/" or is a directory), with mode or src's own.
func copyFileInto(src, root, dst string, mode os.FileMode) error {
	if strings.HasSuffix(dst, "/") {
		dst = path.Join(dst, filepath.Base(src))
	}
	if err := mkdirIn(root, path.Dir(dst)); err != nil {
		return err
	}
	if hp, err := resolveIn(root, dst); err == nil {
		if st, err := os.Stat(hp); err == nil && st.IsDir() {
			dst = path.Join(dst, filepath.Base(src))
		}
	}
	hp, err := placeIn(root, dst)
	if err != nil {
		return err
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if mode == 0 {
		mode = st.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
	}
	if err := os.Remove(hp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replace %s: %w", dst, err)
	}
	if err := copyFile(src, hp, 0o600); err != nil {
		return err
	}
	if err := os.Lchown(hp, 0, 0); err != nil {
		return err
	}
	return os.Chmod(hp, mode) // after chown, which clears set-id bits
}

// copyDirInto copies the content of host directory src into in-image
// directory dst: directories, files (with their modes) and symlinks (as
// they are), owned by root.
func copyDirInto(src, root, dst string) error {
	if err := mkdirIn(root, dst); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." {
			return nil
		}
		in := path.Join(dst, filepath.ToSlash(rel))
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			return mkdirIn(root, in)
		case fi.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hp, err := placeIn(root, in)
			if err != nil {
				return err
			}
			if err := os.Remove(hp); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if err := os.Symlink(t, hp); err != nil {
				return err
			}
			return os.Lchown(hp, 0, 0)
		case fi.Mode().IsRegular():
			hp, err := placeIn(root, in)
			if err != nil {
				return err
			}
			if st, err := os.Lstat(hp); err == nil && st.IsDir() {
				return fmt.Errorf("%s is a directory in the image", in)
			}
			return copyFileInto(p, root, in, 0)
		}
		return fmt.Errorf("%s: not a file, directory or symlink", p)
	})
}

// runEnv is the environment of a recipe's run commands: a root shell's
// defaults, then the base config's env and the recipe's.
func (r *Recipe) runEnv(base *Config) []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C.UTF-8"}
	if base != nil {
		env = mergeEnv(env, base.Env)
	}
	return mergeEnv(env, r.Env)
}
