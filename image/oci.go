package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DigestName is the local name of the image whose manifest has digest d
// ("sha256:HEX" -> "sha256-HEX"): pulled images are stored under it, so a
// lineage that recorded it runs on exactly those bytes whatever its tag
// names later.
func DigestName(d string) string { return strings.Replace(d, ":", "-", 1) }

// refRecord is what refs/<ref> in the meta volume holds: the image a
// reference names now.
type refRecord struct {
	Ref    string    `json:"ref"`
	Image  string    `json:"image"`
	Digest string    `json:"digest"`
	Pulled time.Time `json:"pulled"`
}

func (s *Store) refPath(ref string) string {
	return filepath.Join(s.Snap.Path(metaVolume), "refs", url.PathEscape(ref)+".json")
}

func (s *Store) readRef(ref string) (refRecord, error) {
	var r refRecord
	b, err := os.ReadFile(s.refPath(ref))
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// Resolve returns the local image ref names: a local name as Get does; a
// registry reference through the tag or digest it was last pulled under,
// pulling it (Pull) when the store has none, pull is set and the
// registry is one s.Registry.PullFrom allows. The Info's
// Name is the digest-pinned local name to record.
func (s *Store) Resolve(ctx context.Context, ref string, pull bool, progress io.Writer) (Info, error) {
	if !IsReference(ref) {
		return s.Get(ctx, ref)
	}
	r, err := parseReference(ref)
	if err != nil {
		return Info{}, err
	}
	if rec, err := s.readRef(r.Name()); err == nil {
		if in, err := s.Get(ctx, rec.Image); err == nil {
			return in, nil
		}
	}
	if d, ok := r.(name.Digest); ok {
		if in, err := s.Get(ctx, DigestName(d.DigestStr())); err == nil {
			return in, s.writeRef(ctx, r.Name(), in)
		}
	}
	if !pull {
		return Info{}, fmt.Errorf("image %s: %w (arbor image pull %s)", ref, ErrNotFound, ref)
	}
	if host := r.Context().RegistryStr(); !s.Registry.mayPull(host) {
		from := "no registry"
		if len(s.Registry.PullFrom) > 0 {
			from = strings.Join(s.Registry.PullFrom, ", ")
		}
		return Info{}, fmt.Errorf("image %s: %w: this server pulls from %s, not %s (--pull-from); arbor image pull %s stores it",
			ref, ErrNotFound, from, host, ref)
	}
	return s.Pull(ctx, ref, progress)
}

// Pull fetches image ref from its registry (s.Registry says how: plain
// HTTP, credentials, platform) into the store: the layers it lacks are
// unpacked, each once (unpackLayers), and the image is stored under its
// digest name (DigestName) with ref pointing at it. Pulling a tag again
// moves it to what the registry serves now; images pulled before stay
// under their digests. Progress (layers, bytes, rate) goes to progress
// and the log.
func (s *Store) Pull(ctx context.Context, ref string, progress io.Writer) (Info, error) {
	r, err := parseReference(ref)
	if err != nil {
		return Info{}, err
	}
	opts := s.Registry.options(ctx)
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return Info{}, pullError(ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return Info{}, pullError(ref, fmt.Errorf("pick the %s image: %w", platformString(s.Registry.platform()), err))
	}
	in, err := s.fromImage(ctx, "", img, true, "registry "+r.Name(), progress)
	if err != nil {
		return Info{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	return in, s.writeRef(ctx, r.Name(), in)
}

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

func (s *Store) writeRef(ctx context.Context, ref string, in Info) error {
	if _, err := s.meta(ctx); err != nil {
		return err
	}
	if err := writeJSON(s.refPath(ref), refRecord{Ref: ref, Image: in.Name, Digest: in.Digest, Pulled: time.Now().UTC()}); err != nil {
		return fmt.Errorf("record %s: %w", ref, err)
	}
	return nil
}

// fromImage stores img: its layers (unpackLayers), then the image named
// localName (DigestName of its manifest when ""), a clone of its top
// layer with Arbor's metadata. An image of that name already there is
// returned as it is when it has the same digest.
func (s *Store) fromImage(ctx context.Context, localName string, img v1.Image, compressed bool, source string, progress io.Writer) (Info, error) {
	dg, err := img.Digest()
	if err != nil {
		return Info{}, fmt.Errorf("image digest: %w", err)
	}
	if localName == "" {
		localName = DigestName(dg.String())
	}
	if in, err := s.Get(ctx, localName); err == nil && in.Digest == dg.String() {
		return in, nil
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Info{}, fmt.Errorf("%w: read image config: %v", ErrBadLayer, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return Info{}, fmt.Errorf("%w: image is for %s, not linux", ErrBadLayer, cf.OS)
	}
	p := newProgress(progress, s.logger(), source)
	layers, release, err := s.unpackLayers(ctx, img, compressed, p)
	if err != nil {
		return Info{}, err
	}
	defer release()
	base := ""
	if len(layers) > 0 {
		base = LayerSnapshot(layers[len(layers)-1].Chain)
	}
	fill := func(ctx context.Context, root string, _ io.Writer) (metadata, error) {
		c, err := configFrom(cf, root)
		if err != nil {
			return metadata{}, err
		}
		return metadata{Source: source + "@" + dg.String(), Digest: dg.String(), Layers: layers, Config: c}, nil
	}
	if err := s.create(ctx, localName, base, fill, progress); err != nil && !errors.Is(err, ErrExists) {
		return Info{}, err
	}
	return s.Get(ctx, localName)
}

// importArchive makes image localName from a docker save archive or an
// OCI image layout (a directory, or a tar of one), storing its layers
// once like a pull. It reports false when src is neither (a root file
// system tree or tarball, which Import takes as it always did).
func (s *Store) importArchive(ctx context.Context, localName, src string, progress io.Writer) (bool, error) {
	st, err := os.Stat(src)
	if err != nil {
		return false, err
	}
	var img v1.Image
	compressed := true
	switch {
	case st.IsDir():
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err != nil {
			return false, nil
		}
		if img, err = layoutImage(src, s.Registry.platform()); err != nil {
			return true, err
		}
	default:
		kind, err := sniffArchive(src)
		if err != nil || kind == "" {
			return false, err
		}
		switch kind {
		case "docker":
			// Docker's archives hold layers uncompressed; reading them
			// "compressed" would gzip them on the fly.
			compressed = false
			if img, err = tarball.ImageFromPath(src, nil); err != nil {
				return true, fmt.Errorf("%w: docker archive %s: %v", ErrBadLayer, src, err)
			}
		case "oci":
			dir, err := os.MkdirTemp(s.cacheDir(), "oci-layout-")
			if err != nil {
				if err := os.MkdirAll(s.cacheDir(), 0o755); err != nil {
					return true, err
				}
				if dir, err = os.MkdirTemp(s.cacheDir(), "oci-layout-"); err != nil {
					return true, err
				}
			}
			defer os.RemoveAll(dir)
			if err := run(ctx, nil, "tar", "-x", "-f", src, "-C", dir); err != nil {
				return true, fmt.Errorf("%w: unpack OCI layout %s: %v", ErrBadLayer, src, err)
			}
			if img, err = layoutImage(dir, s.Registry.platform()); err != nil {
				return true, err
			}
		}
	}
	_, err = s.fromImage(ctx, localName, img, compressed, "archive "+src, progress)
	return true, err
}

// sniffArchive reads the names in an uncompressed tar: "docker" when it
// has a top-level manifest.json (docker save; newer Dockers write an OCI
// layout beside it), "oci" for an oci-layout file alone, "" otherwise.
func sniffArchive(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 8)
	n, _ := io.ReadFull(f, head)
	if sniffCompression(head[:n]) != compNone {
		return "", nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tr := tar.NewReader(f)
	kind := ""
	for {
		h, err := tr.Next()
		if err != nil {
			// Not a tar, or its end: what was seen decides.
			return kind, nil
		}
		switch strings.TrimPrefix(h.Name, "./") {
		case "manifest.json":
			return "docker", nil
		case "oci-layout":
			kind = "oci"
		}
	}
}

// layoutImage picks the image of an OCI layout: its only image, or the
// one for platform p from an index.
func layoutImage(dir string, p v1.Platform) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: OCI layout %s: %v", ErrBadLayer, dir, err)
	}
	img, err := pickImage(idx, p)
	if err != nil {
		return nil, fmt.Errorf("%w: OCI layout %s: %v", ErrBadLayer, dir, err)
	}
	return img, nil
}

// pickImage walks an index (and the indexes in it) for an image for
// platform p; an image without a platform counts when it is the only one.
func pickImage(idx v1.ImageIndex, p v1.Platform) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var unplatformed []v1.Descriptor
	for _, d := range im.Manifests {
		switch d.MediaType {
		case types.OCIImageIndex, types.DockerManifestList:
			sub, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := pickImage(sub, p); err == nil {
				return img, nil
			}
		case types.OCIManifestSchema1, types.DockerManifestSchema2:
			if d.Platform != nil && d.Platform.OS == p.OS && d.Platform.Architecture == p.Architecture {
				return idx.Image(d.Digest)
			}
			if d.Platform == nil {
				unplatformed = append(unplatformed, d)
			}
		}
	}
	if len(unplatformed) == 1 {
		return idx.Image(unplatformed[0].Digest)
	}
	return nil, fmt.Errorf("no image for %s among %d manifests", platformString(p), len(im.Manifests))
}

// forgetRefs drops the references that name image name (it is being
// removed): a tag then names nothing until it is pulled again.
func (s *Store) forgetRefs(name string) error {
	dir := filepath.Join(s.Snap.Path(metaVolume), "refs")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list refs: %w", err)
	}
	for _, e := range ents {
		var r refRecord
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || json.Unmarshal(b, &r) != nil || r.Image != name {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("forget ref %s: %w", r.Ref, err)
		}
	}
	return nil
}

// Refs returns the references that name image name now.
func (s *Store) Refs(name string) []string {
	ents, _ := os.ReadDir(filepath.Join(s.Snap.Path(metaVolume), "refs"))
	var out []string
	for _, e := range ents {
		var r refRecord
		b, err := os.ReadFile(filepath.Join(s.Snap.Path(metaVolume), "refs", e.Name()))
		if err == nil && json.Unmarshal(b, &r) == nil && r.Image == name {
			out = append(out, r.Ref)
		}
	}
	return out
}
