package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	kgzip "github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/singleflight"

	"github.com/arbor-env/arbor/cr"
)

// LayerPrefix is where unpacked layers live: one read-only snapshot per
// layer, named by its chain ID (docs/images.md, "Layer storage").
const LayerPrefix = "layers/"

// metaVolume is the writable volume beside the images that holds what
// changes after an image is made: which image a tag names now (refs/)
// and what each layer cost to unpack (layers/).
const metaVolume = "image-meta"

// Layer is one layer of an image as the store keeps it.
type Layer struct {
	// Chain is the layer's chain ID: the digest of its diff ID and every
	// diff ID below it (image-spec config.md, "Layer ChainID"). It names
	// the tree the layer makes with those below, so it is the key the
	// snapshot is stored under: one diff ID on two different bases is
	// two trees.
	Chain string `json:"chain"`
	// DiffID is the digest of the layer's uncompressed tar stream.
	DiffID string `json:"diff_id"`
	// Size is the layer's size as shipped (compressed), when known.
	Size int64 `json:"size,omitempty"`
	// Unpacked is the bytes of file content the layer wrote when it was
	// unpacked (0 for a layer of only deletions and metadata).
	Unpacked int64 `json:"unpacked"`
}

// LayerSnapshot is the snapshot name of the layer with chain ID chain.
func LayerSnapshot(chain string) string { return LayerPrefix + digestHex(chain) }

// digestHex is the hex part of "sha256:HEX".
func digestHex(d string) string {
	_, h, ok := strings.Cut(d, ":")
	if !ok {
		return d
	}
	return h
}

// chainID is the chain ID of a layer with diff ID diff above the layer
// with chain ID parent ("" for the bottom layer).
func chainID(parent, diff string) string {
	if parent == "" {
		return diff
	}
	sum := sha256.Sum256([]byte(parent + " " + diff))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// layerRecord is what layers/<chain>.json in the meta volume holds.
type layerRecord struct {
	Layer
	Created time.Time `json:"created"`
}

// layerBuilds shares one unpack of a layer among concurrent pulls in
// this process; another process loses the race at the atomic snapshot.
var layerBuilds singleflight.Group

// unpackLayers makes sure every layer of img is a snapshot, bottom first,
// unpacking those the store lacks (each on a clone of the one below), and
// returns them. compressed says the layers are best read as shipped
// (registries); archives hand out their uncompressed streams.
//
// Until the caller calls release (also after an error), PruneLayers in
// this process leaves those layers alone: the image that will use them
// does not exist yet.
func (s *Store) unpackLayers(ctx context.Context, img v1.Image, compressed bool, p *pullProgress) (_ []Layer, release func(), err error) {
	held := &[]string{}
	free := func() { s.releaseLayers(*held) }
	defer func() {
		if err != nil {
			free()
		}
	}()
	ls, err := img.Layers()
	if err != nil {
		return nil, nil, fmt.Errorf("list layers: %w", err)
	}
	if len(ls) > MaxLayers {
		return nil, nil, fmt.Errorf("%w: %d layers, more than %d", ErrBadLayer, len(ls), MaxLayers)
	}
	s.cleanStaleBuilds(ctx)
	p.begin(len(ls), ls)
	var out []Layer
	parent := ""
	for i, l := range ls {
		diff, err := l.DiffID()
		if err != nil {
			return nil, nil, fmt.Errorf("layer %d: diff id: %w", i+1, err)
		}
		size, _ := l.Size()
		lay := Layer{Chain: chainID(parent, diff.String()), DiffID: diff.String(), Size: size}
		s.holdLayer(lay.Chain, held)
		if s.hasSnapshot(ctx, LayerSnapshot(lay.Chain)) {
			if rec, err := s.layerRecord(lay.Chain); err == nil {
				lay.Unpacked = rec.Unpacked
			}
			p.skip(i, size)
			out = append(out, lay)
			parent = lay.Chain
			continue
		}
		parentChain := parent
		var v any
		for {
			var shared bool
			v, err, shared = layerBuilds.Do(s.Snap.Path(LayerSnapshot(lay.Chain)), func() (any, error) {
				return s.unpackLayer(ctx, l, lay, parentChain, compressed, p, i)
			})
			// A shared unpack runs under the first caller's ctx: when that
			// ended it, a caller whose own ctx lives tries again (as Ensure).
			if !shared || ctx.Err() != nil || !(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
				break
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("layer %d of %d (%s): %w", i+1, len(ls), short(lay.DiffID), err)
		}
		lay.Unpacked = v.(int64)
		p.unpacked(i)
		out = append(out, lay)
		parent = lay.Chain
	}
	p.end()
	return out, free, nil
}

// layersInUse counts, by a layer snapshot's host path (one key per
// backend and chain), the unpacks in this process that use the layer
// before an image records it, for PruneLayers to leave alone.
var layersInUse = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

func (s *Store) holdLayer(chain string, held *[]string) {
	k := s.Snap.Path(LayerSnapshot(chain))
	layersInUse.Lock()
	layersInUse.n[k]++
	layersInUse.Unlock()
	*held = append(*held, k)
}

func (s *Store) releaseLayers(keys []string) {
	layersInUse.Lock()
	defer layersInUse.Unlock()
	for _, k := range keys {
		if layersInUse.n[k]--; layersInUse.n[k] <= 0 {
			delete(layersInUse.n, k)
		}
	}
}

func layerInUse(key string) bool {
	layersInUse.Lock()
	defer layersInUse.Unlock()
	return layersInUse.n[key] > 0
}

// MaxLayers bounds the layers of one image (Docker's own bound is 127).
const MaxLayers = 127

func short(d string) string {
	h := digestHex(d)
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// unpackLayer makes the snapshot of one layer: a clone of the layer below
// (or an empty volume), the layer applied, its diff ID checked, then one
// atomic snapshot. A failed try leaves nothing; a download that breaks off
// is tried again (Registry.Attempts) from a fresh clone.
func (s *Store) unpackLayer(ctx context.Context, l v1.Layer, lay Layer, parent string, compressed bool, p *pullProgress, i int) (int64, error) {
	attempts := s.Registry.Attempts
	if attempts <= 0 {
		attempts = 3
	}
	var err error
	for try := 1; ; try++ {
		var n int64
		n, err = s.unpackLayerOnce(ctx, l, lay, parent, compressed, p, i)
		if err == nil || errors.Is(err, cr.ErrExists) {
			return n, s.writeLayerRecord(layerRecord{Layer: Layer{Chain: lay.Chain, DiffID: lay.DiffID, Size: lay.Size, Unpacked: n}, Created: time.Now().UTC()})
		}
		if try >= attempts || !retryable(ctx, err) {
			return 0, err
		}
		s.logger().Warn("layer failed, trying again", slog.String("layer", short(lay.DiffID)), slog.Int("try", try), slog.Any("err", err))
		p.retry(i)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Duration(try) * time.Second):
		}
	}
}

// retryable reports whether a layer may succeed when tried again: not
// when the caller gave up, the disk is full, or the layer's content is
// what is wrong.
func retryable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, ErrBadLayer) && !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT)
}

func (s *Store) unpackLayerOnce(ctx context.Context, l v1.Layer, lay Layer, parent string, compressed bool, p *pullProgress, i int) (n int64, err error) {
	start := time.Now()
	base := ""
	if parent != "" {
		base = LayerSnapshot(parent)
	}
	tmp, done, err := s.newBuild(ctx, s.logger(), "layer", base)
	if err != nil {
		return 0, fmt.Errorf("make layer volume: %w", err)
	}
	defer done()
	rc, err := openLayer(l, compressed)
	if err != nil {
		return 0, fmt.Errorf("fetch: %w", err)
	}
	defer rc.Close()
	src := &countingReader{r: rc, p: p, i: i}
	tarStream, err := decompress(src, compressed)
	if err != nil {
		return 0, err
	}
	// Fetching, decompressing and hashing run in a goroutine of their
	// own, a megabyte ahead of the one that applies: each is about half
	// of a layer's CPU time.
	body, wait := readAhead(tarStream)
	n, err = ApplyTar(ctx, s.Snap.Path(tmp), body)
	if err == nil {
		// The tar's end-of-archive blocks (and any padding) belong to the
		// stream the diff ID covers, and a registry's digest check
		// happens at the end of its stream.
		if _, err = io.Copy(io.Discard, body); err != nil {
			err = fmt.Errorf("read layer end: %w", err)
		}
	}
	body.Close()
	diff := wait()
	if err != nil {
		return n, src.wrap(err)
	}
	if diff != lay.DiffID {
		return n, fmt.Errorf("%w: content has diff id %s, the image says %s", ErrBadLayer, diff, lay.DiffID)
	}
	applied := time.Now()
	if err := s.Snap.Snapshot(ctx, tmp, LayerSnapshot(lay.Chain)); err != nil {
		return n, fmt.Errorf("snapshot layer: %w", err)
	}
	s.logger().Debug("layer unpacked", slog.String("layer", short(lay.DiffID)), slog.Int64("bytes", n),
		slog.Duration("apply", applied.Sub(start)), slog.Duration("snapshot", time.Since(applied)))
	return n, nil
}

// readAhead reads r in a goroutine, up to aheadChunks chunks of
// aheadChunk bytes ahead of the returned reader's consumer, hashing what
// it reads. (An io.Pipe would not do: its writer waits until the reader
// took all it wrote, so the two would take turns instead of overlapping.)
// wait, once the reader is closed (or read to its end), returns the
// digest of all r gave.
func readAhead(r io.Reader) (io.ReadCloser, func() string) {
	a := &ahead{chunks: make(chan chunk, aheadChunks), free: make(chan []byte, aheadChunks+1), stop: make(chan struct{})}
	done := make(chan string, 1)
	go func() {
		defer close(a.chunks)
		h := sha256.New()
		defer func() { done <- "sha256:" + hex.EncodeToString(h.Sum(nil)) }()
		for {
			var b []byte
			select {
			case b = <-a.free:
			default:
				b = make([]byte, aheadChunk)
			}
			n, err := io.ReadFull(r, b)
			if n > 0 {
				h.Write(b[:n])
				select {
				case a.chunks <- chunk{b: b[:n]}:
				case <-a.stop:
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.ErrUnexpectedEOF) {
					err = io.EOF
				}
				select {
				case a.chunks <- chunk{err: err}:
				case <-a.stop:
				}
				return
			}
		}
	}()
	return a, func() string { return <-done }
}

const (
	aheadChunk  = 1 << 20
	aheadChunks = 8
)

// ahead is readAhead's reader.
type ahead struct {
	chunks chan chunk
	free   chan []byte // drained chunks, for the goroutine to fill again
	stop   chan struct{}
	cur    []byte
	buf    []byte // cur's whole chunk
	err    error
	closed bool
}

type chunk struct {
	b   []byte
	err error
}

func (a *ahead) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		if a.buf != nil {
			select {
			case a.free <- a.buf[:cap(a.buf)]:
			default:
			}
			a.buf = nil
		}
		if a.err != nil {
			return 0, a.err
		}
		c, ok := <-a.chunks
		if !ok {
			a.err = io.ErrClosedPipe
			continue
		}
		a.cur, a.buf, a.err = c.b, c.b, c.err
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

// Close stops the reading goroutine; its wait then returns.
func (a *ahead) Close() error {
	if !a.closed {
		a.closed = true
		close(a.stop)
	}
	return nil
}

// openLayer opens the layer's stream: as shipped for a registry (so its
// digest is checked as it is read and the progress counts wire bytes),
// uncompressed for an archive (which may store it so).
func openLayer(l v1.Layer, compressed bool) (io.ReadCloser, error) {
	if compressed {
		return l.Compressed()
	}
	return l.Uncompressed()
}

// decompress undoes the compression of a shipped layer, found by its
// first bytes (gzip, zstd or none), with klauspost's decoders (several
// times faster than the standard library's gzip).
func decompress(r io.Reader, compressed bool) (io.Reader, error) {
	if !compressed {
		return r, nil
	}
	br := bufio.NewReaderSize(r, 1<<20)
	head, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		zr, err := kgzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip: %v", ErrBadLayer, err)
		}
		return zr, nil
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: zstd: %v", ErrBadLayer, err)
		}
		return zr.IOReadCloser(), nil
	}
	return br, nil
}

// countingReader counts a layer's bytes for the progress and remembers
// the stream's own error, so that a failure to fetch is told apart from
// a failure to apply.
type countingReader struct {
	r   io.Reader
	p   *pullProgress
	i   int
	err error
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.add(c.i, int64(n))
	if err != nil && !errors.Is(err, io.EOF) {
		c.err = err
	}
	return n, err
}

// wrap words an apply error: a broken stream is a fetch error (tried
// again), a digest the registry's bytes do not match a bad layer.
func (c *countingReader) wrap(err error) error {
	if c.err == nil {
		return err
	}
	if strings.Contains(c.err.Error(), "error verifying") {
		return fmt.Errorf("%w: %v", ErrBadLayer, c.err)
	}
	return fmt.Errorf("fetch: %w", c.err)
}

// hasSnapshot reports whether snapshot name exists.
func (s *Store) hasSnapshot(ctx context.Context, name string) bool {
	vols, err := s.Snap.List(ctx, name)
	if err != nil {
		return false
	}
	for _, v := range vols {
		if v.Name == name {
			return true
		}
	}
	return false
}

// meta returns the host path of the meta volume, making it on first use.
func (s *Store) meta(ctx context.Context) (string, error) {
	if !s.hasSnapshot(ctx, metaVolume) {
		if err := s.Snap.CreateVolume(ctx, metaVolume); err != nil && !errors.Is(err, cr.ErrExists) {
			return "", fmt.Errorf("make image meta volume: %w", err)
		}
	}
	return s.Snap.Path(metaVolume), nil
}

func (s *Store) layerRecord(chain string) (layerRecord, error) {
	var r layerRecord
	b, err := os.ReadFile(filepath.Join(s.Snap.Path(metaVolume), "layers", digestHex(chain)+".json"))
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

func (s *Store) writeLayerRecord(r layerRecord) error {
	dir, err := s.meta(context.Background())
	if err != nil {
		return err
	}
	return writeJSON(filepath.Join(dir, "layers", digestHex(r.Chain)+".json"), r)
}

// writeJSON writes v to p atomically (a temporary file renamed).
func writeJSON(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".tmp-" + randSuffix()
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// PruneLayers destroys the layer snapshots no image uses (and no unpack
// in this process is about to) and returns how many. Images keep every layer of their chain, so a layer two images
// share stays while either does.
func (s *Store) PruneLayers(ctx context.Context) (int, error) {
	imgs, err := s.List(ctx)
	if err != nil {
		return 0, err
	}
	used := map[string]bool{}
	for _, in := range imgs {
		for _, l := range in.Layers {
			used[LayerSnapshot(l.Chain)] = true
		}
	}
	vols, err := s.Snap.List(ctx, LayerPrefix)
	if err != nil {
		return 0, fmt.Errorf("list layers: %w", err)
	}
	n := 0
	for _, v := range vols {
		if !strings.HasPrefix(v.Name, LayerPrefix) || used[v.Name] || layerInUse(s.Snap.Path(v.Name)) {
			continue
		}
		if err := s.Snap.Destroy(ctx, v.Name); err != nil && !errors.Is(err, cr.ErrNotFound) {
			return n, fmt.Errorf("remove layer %s: %w", v.Name, err)
		}
		_ = os.Remove(filepath.Join(s.Snap.Path(metaVolume), "layers", strings.TrimPrefix(v.Name, LayerPrefix)+".json"))
		n++
	}
	return n, nil
}

// Shared returns, by image name, the bytes of the image's layers that
// another of imgs also uses (counted by each layer's unpacked size).
func Shared(imgs []Info) map[string]int64 {
	users := map[string]int{}
	for _, in := range imgs {
		for _, l := range in.Layers {
			users[l.Chain]++
		}
	}
	out := map[string]int64{}
	for _, in := range imgs {
		for _, l := range in.Layers {
			if users[l.Chain] > 1 {
				out[in.Name] += l.Unpacked
			}
		}
	}
	return out
}
