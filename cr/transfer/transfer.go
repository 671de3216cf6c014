// Package transfer is the wire format of one state shipped from one
// node's engine to another's (docs/cluster.md, "State transfer"): a
// header naming the state and the artifacts that follow, each artifact's
// bytes in length-prefixed chunks, and a SHA-256 of everything before it
// as the trailer. A receiver reads the parts as they arrive (into btrfs
// receive, into an image directory) and commits nothing until Verify
// has checked the trailer, so a stream cut short or damaged on the way
// is refused as a whole. The package is pure: no syscalls, no files.
package transfer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/arbor-env/arbor/cr/manifest"
)

// Magic opens every stream; its last byte is the format's version.
const Magic = "ARBORXF1"

// Bounds a reader enforces, so that a damaged length cannot make it
// allocate without end.
const (
	MaxHeader = 1 << 20
	MaxChunk  = 4 << 20
	// ChunkSize is the size of the chunks a Writer makes.
	ChunkSize = 256 << 10
)

// ErrCorrupt is wrapped by every error a Reader returns for a stream that
// is not a well-formed, complete stream with a matching checksum.
var ErrCorrupt = errors.New("transfer stream corrupt or truncated")

// Header is what a stream carries before its parts.
type Header struct {
	// State is the state's record as its sender's manifest holds it
	// (the owner's flags, released, pinned and timings, left out).
	State manifest.State `json:"state"`
	// Image, Origin and Labels are those of the env that made the state
	// (the labels its owner keeps on it: task, base turn, seed).
	Image  string            `json:"image"`
	Origin string            `json:"origin,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Parts are the artifacts that follow, in order: those of the state
	// the receiver did not hold.
	Parts []Part `json:"parts"`
}

// Part is one artifact of the stream.
type Part struct {
	Artifact manifest.Artifact `json:"artifact"`
	// Base, for a file snapshot, is the id of the fs artifact the bytes
	// are the difference from ("": a whole snapshot); the receiver holds
	// it.
	Base string `json:"base,omitempty"`
}

// Validate checks that the header names a state and that its parts are
// artifacts of it, each once.
func (h Header) Validate() error {
	if h.State.ID == "" || h.State.Env == "" {
		return fmt.Errorf("%w: header without state or env id", ErrCorrupt)
	}
	seen := map[string]bool{}
	for _, p := range h.Parts {
		a := p.Artifact
		switch {
		case seen[a.ID]:
			return fmt.Errorf("%w: artifact %s twice", ErrCorrupt, a.ID)
		case a.Kind == manifest.ArtifactFS && a.ID == h.State.FS, a.Kind == manifest.ArtifactProc && a.ID == h.State.Proc:
		default:
			return fmt.Errorf("%w: part %s (%s) is not an artifact of state %s", ErrCorrupt, a.ID, a.Kind, h.State.ID)
		}
		if p.Base != "" && a.Kind != manifest.ArtifactFS {
			return fmt.Errorf("%w: process image %s with a base", ErrCorrupt, a.ID)
		}
		seen[a.ID] = true
	}
	return nil
}

// Writer writes one stream: NewWriter writes the header, Part returns a
// writer for each part in the header's order, Close the trailer.
type Writer struct {
	w     io.Writer
	h     hash.Hash
	parts int
	open  bool
	n     int64
	err   error
}

// NewWriter writes the magic and h to w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode transfer header: %w", err)
	}
	if len(b) > MaxHeader {
		return nil, fmt.Errorf("transfer header of %d bytes, over %d", len(b), MaxHeader)
	}
	tw := &Writer{w: w, h: sha256.New(), parts: len(h.Parts)}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	tw.write([]byte(Magic))
	tw.write(n[:])
	tw.write(b)
	return tw, tw.err
}

func (tw *Writer) write(b []byte) {
	if tw.err != nil {
		return
	}
	n, err := tw.w.Write(b)
	tw.h.Write(b[:n])
	tw.n += int64(n)
	tw.err = err
}

// Bytes is what the Writer wrote so far.
func (tw *Writer) Bytes() int64 { return tw.n }

// Part starts the next part; its writer's Close ends it. Parts are
// written one after the other, in the header's order.
func (tw *Writer) Part() (io.WriteCloser, error) {
	if tw.open || tw.parts == 0 {
		return nil, errors.New("transfer writer: no part left to write, or the last one not closed")
	}
	tw.parts--
	tw.open = true
	return &partWriter{tw: tw, buf: make([]byte, 0, ChunkSize)}, nil
}

// Close writes the trailer; every part must have been written.
func (tw *Writer) Close() error {
	if tw.open || tw.parts != 0 {
		return fmt.Errorf("transfer writer: closed with %d parts not written", tw.parts)
	}
	tw.write(tw.h.Sum(nil))
	return tw.err
}

type partWriter struct {
	tw  *Writer
	buf []byte
}

func (p *partWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), ChunkSize-len(p.buf))
		p.buf = append(p.buf, b[:k]...)
		b, n = b[k:], n+k
		if len(p.buf) == ChunkSize {
			p.flush()
		}
		if p.tw.err != nil {
			return n, p.tw.err
		}
	}
	return n, nil
}

func (p *partWriter) flush() {
	if len(p.buf) == 0 {
		return
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(p.buf)))
	p.tw.write(n[:])
	p.tw.write(p.buf)
	p.buf = p.buf[:0]
}

func (p *partWriter) Close() error {
	p.flush()
	p.tw.write([]byte{0, 0, 0, 0})
	p.tw.open = false
	return p.tw.err
}

// Reader reads one stream: NewReader reads and checks the header, Next
// returns each part's bytes in turn, Verify reads the trailer and checks
// it against everything read.
type Reader struct {
	r     io.Reader
	h     hash.Hash
	hdr   Header
	parts int
	cur   *partReader
	n     int64
}

// NewReader reads the magic and the header from r.
func NewReader(r io.Reader) (*Reader, error) {
	tr := &Reader{r: r, h: sha256.New()}
	var pre [len(Magic) + 4]byte
	if err := tr.full(pre[:]); err != nil {
		return nil, err
	}
	if string(pre[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("%w: not a transfer stream (magic %q)", ErrCorrupt, pre[:len(Magic)])
	}
	n := binary.BigEndian.Uint32(pre[len(Magic):])
	if n == 0 || n > MaxHeader {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrCorrupt, n)
	}
	b := make([]byte, n)
	if err := tr.full(b); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tr.hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if err := tr.hdr.Validate(); err != nil {
		return nil, err
	}
	tr.parts = len(tr.hdr.Parts)
	return tr, nil
}

// full reads exactly len(b) bytes into the checksum.
func (tr *Reader) full(b []byte) error {
	n, err := io.ReadFull(tr.r, b)
	tr.h.Write(b[:n])
	tr.n += int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: cut short after %d bytes", ErrCorrupt, tr.n)
		}
		return fmt.Errorf("read transfer stream: %w", err)
	}
	return nil
}

// Header is the stream's header.
func (tr *Reader) Header() Header { return tr.hdr }

// Bytes is what the Reader read so far.
func (tr *Reader) Bytes() int64 { return tr.n }

// Next returns a reader of the next part's bytes (io.EOF at its end);
// what the caller leaves unread of the previous part is skipped.
func (tr *Reader) Next() (io.Reader, error) {
	if err := tr.skip(); err != nil {
		return nil, err
	}
	if tr.parts == 0 {
		return nil, errors.New("transfer reader: no part left")
	}
	tr.parts--
	tr.cur = &partReader{tr: tr}
	return tr.cur, nil
}

func (tr *Reader) skip() error {
	if tr.cur == nil {
		return nil
	}
	_, err := io.Copy(io.Discard, tr.cur)
	tr.cur = nil
	return err
}

// Verify reads the rest of the stream (the parts not read are skipped)
// and the trailer, and checks that the checksum matches and that nothing
// follows.
func (tr *Reader) Verify() error {
	for tr.parts > 0 {
		if _, err := tr.Next(); err != nil {
			return err
		}
	}
	if err := tr.skip(); err != nil {
		return err
	}
	want := tr.h.Sum(nil)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(tr.r, got); err != nil {
		return fmt.Errorf("%w: no checksum after %d bytes: %v", ErrCorrupt, tr.n, err)
	}
	tr.n += int64(len(got))
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%w: sha256 of the stream %x, its trailer says %x", ErrCorrupt, want, got)
	}
	var extra [1]byte
	if n, _ := tr.r.Read(extra[:]); n > 0 {
		return fmt.Errorf("%w: bytes after the trailer", ErrCorrupt)
	}
	return nil
}

type partReader struct {
	tr   *Reader
	left int
	done bool
	err  error
}

func (p *partReader) Read(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	for p.left == 0 {
		if p.done {
			return 0, io.EOF
		}
		var n [4]byte
		if err := p.tr.full(n[:]); err != nil {
			p.err = err
			return 0, err
		}
		k := binary.BigEndian.Uint32(n[:])
		if k > MaxChunk {
			p.err = fmt.Errorf("%w: chunk of %d bytes", ErrCorrupt, k)
			return 0, p.err
		}
		if k == 0 {
			p.done = true
			return 0, io.EOF
		}
		p.left = int(k)
	}
	b = b[:min(len(b), p.left)]
	if err := p.tr.full(b); err != nil {
		p.err = err
		return 0, err
	}
	p.left -= len(b)
	return len(b), nil
}
