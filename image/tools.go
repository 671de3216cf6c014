package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// run executes a host tool, copying its output to progress (when not nil)
// and returning an error that carries the tail of that output.
func run(ctx context.Context, progress io.Writer, name string, args ...string) error {
	path, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMissingTool, name, err)
	}
	tail := &tailBuffer{max: 2048}
	var w io.Writer = tail
	if progress != nil && progress != io.Discard {
		w = io.MultiWriter(&syncWriter{w: progress}, tail)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = w, w
	// On cancellation kill the tool's whole process group: debootstrap
	// leaves dpkg and chroot children that would otherwise keep running
	// in (and keep mounts alive inside) a build root being destroyed.
	killGroupOnCancel(cmd)
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", name, ctx.Err())
		}
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(tail.String()))
	}
	return nil
}

// syncWriter serializes writes so that stdout and stderr of one process can
// share a progress writer that is not itself safe for concurrent use.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// copyTree copies the tree at src into the existing directory dst,
// preserving owners, modes, links, device nodes and xattrs, and sharing
// extents where the filesystem can (btrfs reflinks).
func copyTree(ctx context.Context, src, dst string) error {
	return run(ctx, nil, "cp", "-a", "--reflink=auto", "--", src+"/.", dst+"/")
}

// compression is how a tarball is compressed.
type compression int

const (
	compNone compression = iota
	compGzip
	compZstd
	compXz
	compBzip2
)

// sniffCompression identifies a tarball's compression from its first bytes.
func sniffCompression(head []byte) compression {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return compGzip
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return compZstd
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}):
		return compXz
	case bytes.HasPrefix(head, []byte("BZh")):
		return compBzip2
	}
	return compNone
}

// tarFlags returns GNU tar's flag for a compression, after checking the
// compressor it runs is installed.
func tarFlags(c compression) ([]string, error) {
	var flag, tool string
	switch c {
	case compNone:
		return nil, nil
	case compGzip:
		flag, tool = "--gzip", "gzip"
	case compZstd:
		flag, tool = "--use-compress-program=zstd -T0", "zstd"
	case compXz:
		flag, tool = "--xz", "xz"
	case compBzip2:
		flag, tool = "--bzip2", "bzip2"
	}
	if _, err := exec.LookPath(tool); err != nil {
		return nil, fmt.Errorf("%w: %s (needed for this tarball)", ErrMissingTool, tool)
	}
	return []string{flag}, nil
}

// tarCommon keeps everything a root filesystem needs across a tar round
// trip: numeric owners, permissions, xattrs (file capabilities).
var tarCommon = []string{"--numeric-owner", "--xattrs", "--xattrs-include=*"}

// extractTarball unpacks the tarball src into the directory dst.
func Unpack(ctx context.Context, src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open tarball: %w", err)
	}
	head := make([]byte, 8)
	n, err := io.ReadFull(f, head)
	f.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("read tarball %s: %w", src, err)
	}
	comp, err := tarFlags(sniffCompression(head[:n]))
	if err != nil {
		return err
	}
	args := append([]string{"-x", "-p", "--same-owner"}, tarCommon...)
	args = append(args, comp...)
	args = append(args, "-f", src, "-C", dst)
	return run(ctx, nil, "tar", args...)
}

// createTarball writes the tree at root to the tarball dst (compressed with
// zstd when dst ends in .zst, gzip when in .gz), leaving out the in-root
// paths in exclude. It writes a temporary file and renames it, so a reader
// never sees half a tarball.
func createTarball(ctx context.Context, root, dst string, exclude ...string) (err error) {
	var c compression
	switch {
	case strings.HasSuffix(dst, ".zst"):
		c = compZstd
	case strings.HasSuffix(dst, ".gz"):
		c = compGzip
	}
	comp, err := tarFlags(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("make cache dir: %w", err)
	}
	tmp := dst + ".tmp-" + randSuffix()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	args := append([]string{"-c"}, tarCommon...)
	args = append(args, comp...)
	for _, e := range exclude {
		args = append(args, "--exclude=."+e)
	}
	args = append(args, "-f", tmp, "-C", root, ".")
	if err := run(ctx, nil, "tar", args...); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("store tarball: %w", err)
	}
	return nil
}
