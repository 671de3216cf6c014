package btrfs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/arbor-env/arbor/cr"
)

var _ cr.Streamer = (*Snapshotter)(nil)

// Send writes read-only snapshot name to w with `btrfs send`, as the
// difference from read-only snapshot parent when parent is not "" (-p).
// The pool that receives it must hold parent, received from this pool or
// the one this pool received it from: btrfs finds it by its (received)
// UUID.
func (s *Snapshotter) Send(ctx context.Context, name, parent string, w io.Writer) error {
	p, err := s.source(name)
	if err != nil {
		return fmt.Errorf("send %s: %w", name, err)
	}
	args := []string{"send", "-q"}
	if parent != "" {
		pp, err := s.source(parent)
		if err != nil {
			return fmt.Errorf("send %s: parent: %w", name, err)
		}
		args = append(args, "-p", pp)
	}
	args = append(args, p)
	cmd := exec.CommandContext(ctx, "btrfs", args...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &stderr
	cmd.WaitDelay = 5 * time.Second // the copy to w, once btrfs is gone
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("btrfs send %s (parent %q): %w: %s", name, parent, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Receive makes read-only snapshot name from a `btrfs send` stream of a
// snapshot with the same base name, which it checks in the stream's
// first command before it starts btrfs receive in name's folder. A
// stream cut short or damaged leaves nothing: what btrfs receive made of
// it is destroyed.
func (s *Snapshotter) Receive(ctx context.Context, name string, r io.Reader) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("receive %s: %w", name, err)
		}
	}()
	br := bufio.NewReaderSize(r, maxFirstCmdLen+streamHdrLen+cmdHdrLen)
	var got string
	for need := streamHdrLen + cmdHdrLen; ; {
		b, perr := br.Peek(need)
		n, _, more, err := streamSubvol(b)
		if err != nil {
			return err
		}
		if more == 0 {
			got = n
			break
		}
		if perr != nil {
			return fmt.Errorf("send stream cut short in its first command: %w", perr)
		}
		need = more
	}
	if got != path.Base(name) {
		return fmt.Errorf("the stream makes subvolume %q, want %q", got, path.Base(name))
	}
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	parent, base, err := s.prepare(name)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if sub, _, _ := isSubvol(filepath.Join(parent, base)); sub {
				if derr := destroySubvol(parent, base); derr != nil {
					s.log.Warn("destroy what a failed receive made", slog.String("name", name), slog.Any("err", derr))
				}
			}
		}
	}()
	cmd := exec.CommandContext(ctx, "btrfs", "receive", "-q", "-e", parent)
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stderr = br, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("btrfs receive: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	info, err := getSubvolInfo(filepath.Join(parent, base))
	if err != nil {
		return fmt.Errorf("subvolume info: %w", err)
	}
	if info.flags&rootSubvolRdonly == 0 {
		return fmt.Errorf("received %s is not read-only: the stream was cut short", base)
	}
	return nil
}
