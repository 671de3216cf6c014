package btrfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/arbor-env/arbor/cr"
)

var _ cr.Streamer = (*Snapshotter)(nil)

// recvPrefix names the directories under tmpDir that a Receive in
// progress receives into; pruneTmp removes those a crash left.
const recvPrefix = "recv-"

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
// snapshot with the same base name. The stream is received into a fresh
// directory under the pool's temporary folder and moved into place only
// once btrfs receive succeeded and made exactly that snapshot, so a
// truncated or damaged stream (or one of another snapshot) leaves nothing:
// what it made is destroyed.
func (s *Snapshotter) Receive(ctx context.Context, name string, r io.Reader) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("receive %s: %w", name, err)
		}
	}()
	tmp := filepath.Join(s.root, tmpDir)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	var b [8]byte
	rand.Read(b[:])
	dir := filepath.Join(tmp, recvPrefix+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer s.removeRecvDir(dir)
	cmd := exec.CommandContext(ctx, "btrfs", "receive", "-q", dir)
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stderr = r, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("btrfs receive: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	base := path.Base(name)
	if len(ents) != 1 || ents[0].Name() != base {
		names := make([]string, len(ents))
		for i, e := range ents {
			names[i] = e.Name()
		}
		return fmt.Errorf("the stream made %v, want %s", names, base)
	}
	got := filepath.Join(dir, base)
	if info, err := getSubvolInfo(got); err != nil {
		return fmt.Errorf("subvolume info: %w", err)
	} else if info.flags&rootSubvolRdonly == 0 {
		return fmt.Errorf("received %s is not read-only: the stream was cut short", base)
	}
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	parent, _, err := s.prepare(name)
	if err != nil {
		return err
	}
	if err := os.Rename(got, filepath.Join(parent, base)); err != nil {
		return mapErrno(name, err)
	}
	return nil
}

// removeRecvDir destroys whatever a Receive made in dir (nothing, once
// it moved its snapshot into place) and removes dir.
func (s *Snapshotter) removeRecvDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if err := destroySubvol(dir, e.Name()); err != nil {
			if rerr := os.RemoveAll(filepath.Join(dir, e.Name())); rerr != nil {
				s.log.Warn("remove what a failed receive made", slog.String("name", e.Name()), slog.Any("err", err))
			}
		}
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		s.log.Warn("remove receive dir", slog.String("dir", dir), slog.Any("err", err))
	}
}
