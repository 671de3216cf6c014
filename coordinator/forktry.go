package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// sandboxDir holds the sandbox's own files (init's control socket), which
// change with every restore.
const sandboxDir = "/.arbor"

// FileChange is a path whose file differs between two states.
type FileChange struct {
	Path string `json:"path"`
	Kind string `json:"kind"` // added, modified, deleted
}

// Tried is what a command did on a throwaway branch (ForkTry).
type Tried struct {
	Result *sandbox.Result
	// FromState is the state the branch started from: the env's head,
	// which ForkTry leaves as it is.
	FromState string
	// Changes are the paths the command changed (none of the sandbox's
	// own); ChangesErr says why they could not be listed.
	Changes    []FileChange
	ChangesErr error
	// Branched, Ran and Listed are when the branch was made, the command
	// ended and its changes were listed (before the branch was closed).
	Branched, Ran, Listed time.Time
}

// ForkTry runs a's command (its Cmd, Timeout as Turn picks it, MaxOutput)
// on a throwaway branch of env envID and lists the files it changed; the
// env is untouched and the branch, never registered, is closed before
// ForkTry returns. The caller holds the env's ticket.
func (c *Coordinator) ForkTry(ctx context.Context, envID string, a Action) (*Tried, error) {
	env, m, err := c.lookup(ctx, envID)
	if err != nil {
		return nil, err
	}
	br, err := c.e.Branch(ctx, branch.Source{Env: env}, 1)
	if err != nil {
		return nil, fmt.Errorf("branch: %w", err)
	}
	child := br.Children[0]
	if br.Errors[0] != nil || child == nil {
		return nil, fmt.Errorf("branch: %w", errors.Join(br.Errors[0], errors.New("no child")))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if cerr := c.e.CloseEnv(cctx, child); cerr != nil {
			c.log.Warn("close fork_try branch", slog.String("env", child.ID), slog.Any("err", cerr))
		}
	}()
	out := &Tried{FromState: br.State, Branched: time.Now()}
	out.Result, err = c.e.Exec(ctx, child, a.Cmd, sandbox.ExecOptions{Timeout: c.commandTimeout(m, a.Timeout), MaxOutput: a.MaxOutput})
	if err != nil {
		return nil, fmt.Errorf("run on the branch: %w", err)
	}
	out.Ran = time.Now()
	out.Changes, out.ChangesErr = c.changes(ctx, child, br.State)
	out.Listed = time.Now()
	return out, nil
}

// changes lists the files child changed since state from, by
// checkpointing its files and comparing the two snapshots.
func (c *Coordinator) changes(ctx context.Context, child *branch.Env, from string) ([]FileChange, error) {
	sid, err := c.e.Checkpoint(ctx, child, state.FS)
	if err != nil {
		return nil, err
	}
	cs, err := c.e.StateChanges(ctx, from, sid)
	if err != nil {
		return nil, err
	}
	out := make([]FileChange, 0, len(cs))
	for _, ch := range cs {
		if ch.Path != sandboxDir && !strings.HasPrefix(ch.Path, sandboxDir+"/") {
			out = append(out, FileChange{Path: ch.Path, Kind: string(ch.Kind)})
		}
	}
	return out, nil
}
