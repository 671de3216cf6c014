package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"unicode/utf8"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// The web view's diff of two states (GET /ui/api/diff?a=STATE&b=STATE,
// docs/ui.md, "Diff of two states"): the paths whose files changed (the
// snapshotter's Changes), a unified diff of each changed text file, and
// what is known of the shells' state (the working directory each turn
// reported; the shell delta scripts of shell delta states). It is served
// under the web view's access rules (uiAccess) by a server with a
// coordinator.

// Bounds of one diff.
const (
	diffMaxPaths     = 2000      // changed paths listed
	diffMaxFiles     = 200       // files whose content is compared
	diffMaxFileBytes = 256 << 10 // one side of one file
	diffMaxBytes     = 1 << 20   // the text diffs of one answer together
	diffMaxIDBytes   = 256       // a state id asked for
	diffParallel     = 2         // diffs computed at once; more wait
)

// StateDiff is the answer of /ui/api/diff.
type StateDiff struct {
	A DiffSide `json:"a"`
	B DiffSide `json:"b"`
	// Files are the changed paths from A to B, sorted (the first
	// diffMaxPaths of Changed).
	Files   []FileDiff `json:"files"`
	Changed int        `json:"changed"`
	// Truncated: paths or text diffs were left out at the bounds.
	Truncated bool      `json:"truncated,omitempty"`
	Shell     ShellDiff `json:"shell"`
}

// DiffSide is one of the two states.
type DiffSide struct {
	State string `json:"state"`
	Env   string `json:"env"`
	Turn  int    `json:"turn"`
	Kind  string `json:"kind"`
}

// FileDiff is one changed path.
type FileDiff struct {
	Path   string `json:"path"`
	Change string `json:"change"` // added, modified, deleted
	// TypeA and TypeB are what the path is in each state: file, dir,
	// symlink, other ("" where it is absent).
	TypeA string `json:"type_a,omitempty"`
	TypeB string `json:"type_b,omitempty"`
	SizeA int64  `json:"size_a,omitempty"`
	SizeB int64  `json:"size_b,omitempty"`
	// LinkA and LinkB are a symbolic link's target, as text: links are
	// the sandbox's and never followed.
	LinkA  string `json:"link_a,omitempty"`
	LinkB  string `json:"link_b,omitempty"`
	Binary bool   `json:"binary,omitempty"`
	// Diff is the unified diff of a text file.
	Diff string `json:"diff,omitempty"`
	// Note says why a file has no diff: "binary", "too large", "through
	// a symbolic link", "past the diff's bounds".
	Note string `json:"note,omitempty"`
}

// ShellDiff is what changed in the shell, as far as it is recorded.
type ShellDiff struct {
	// CwdA and CwdB are the working directories the newest turn on each
	// state's path reported ("" when none did).
	CwdA string `json:"cwd_a,omitempty"`
	CwdB string `json:"cwd_b,omitempty"`
	// DigestA and DigestB are the shell digests of shell delta states.
	DigestA string `json:"digest_a,omitempty"`
	DigestB string `json:"digest_b,omitempty"`
	// Diff is the diff of the two states' shell delta scripts (their
	// variables, functions, aliases, options and directory), when both
	// are shell delta states on one process image.
	Diff string `json:"diff,omitempty"`
	// Note says what is not known.
	Note string `json:"note,omitempty"`
}

// stateDiffs serves /ui/api/diff.
type stateDiffs struct {
	c   *coordinator.Coordinator
	log *slog.Logger
	sem chan struct{}
}

func newStateDiffs(c *coordinator.Coordinator, log *slog.Logger) *stateDiffs {
	return &stateDiffs{c: c, log: log, sem: make(chan struct{}, diffParallel)}
}

func (d *stateDiffs) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a, b := q.Get("a"), q.Get("b")
	if a == "" || b == "" || len(a) > diffMaxIDBytes || len(b) > diffMaxIDBytes {
		http.Error(w, "a diff needs two state ids: ?a=STATE&b=STATE", http.StatusBadRequest)
		return
	}
	select {
	case d.sem <- struct{}{}:
		defer func() { <-d.sem }()
	case <-r.Context().Done():
		return
	}
	out, err := d.diff(r.Context(), a, b)
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, state.ErrUnknownState):
			code = http.StatusNotFound
		case errors.Is(err, state.ErrInvalidParams):
			code = http.StatusBadRequest
		}
		if code == http.StatusInternalServerError {
			d.log.Warn("state diff", slog.String("a", a), slog.String("b", b), slog.Any("err", err))
		}
		http.Error(w, protocol.ErrorOf(err).Message, code)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// diff compares state a to state b.
func (d *stateDiffs) diff(ctx context.Context, a, b string) (*StateDiff, error) {
	out := &StateDiff{Files: []FileDiff{}}
	var cwd [2]string
	for i, sid := range []string{a, b} {
		// The trajectory waits for a state a step just returned (its
		// checkpoint may still run) and says where its shell was.
		tr, err := d.c.Trajectory(ctx, "", sid)
		if err != nil {
			return nil, err
		}
		for j := len(tr.Turns) - 1; j >= 0 && cwd[i] == ""; j-- {
			cwd[i] = tr.Turns[j].Obs.Cwd
		}
	}
	cmp, err := d.c.Compare(ctx, a, b)
	if err != nil {
		return nil, err
	}
	sa, sb := cmp.A, cmp.B
	out.A = DiffSide{State: sa.ID, Env: sa.Env, Turn: sa.Turn, Kind: string(sa.Kind)}
	out.B = DiffSide{State: sb.ID, Env: sb.Env, Turn: sb.Turn, Kind: string(sb.Kind)}
	out.Shell = ShellDiff{CwdA: cwd[0], CwdB: cwd[1], DigestA: sa.ShellDigest, DigestB: sb.ShellDigest}
	switch {
	case sa.ShellDigest != "" && sb.ShellDigest != "" && sa.Proc == sb.Proc:
		out.Shell.Diff = unified("a/shell", "b/shell", sa.ShellDelta, sb.ShellDelta)
	case sa.Proc == sb.Proc && sa.ShellDigest == sb.ShellDigest:
		out.Shell.Note = "one process image: the shells are the same"
	default:
		out.Shell.Note = "variables, functions and options are in the states' process images, not recorded apart: only the working directory is compared"
	}
	changes := cmp.Changes
	out.Changed = len(changes)
	if len(changes) > diffMaxPaths {
		changes, out.Truncated = changes[:diffMaxPaths], true
	}
	if len(changes) == 0 {
		return out, nil
	}
	ta, err := d.tree(a)
	if err != nil {
		return nil, err
	}
	defer ta.release()
	tb, err := d.tree(b)
	if err != nil {
		return nil, err
	}
	defer tb.release()
	budget, compared := diffMaxBytes, 0
	for _, ch := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f, err := compare(ta.stateTree, tb.stateTree, ch, &budget, &compared)
		if err != nil {
			return nil, err
		}
		if f.Note == noteBounds {
			out.Truncated = true
		}
		out.Files = append(out.Files, f)
	}
	return out, nil
}

// heldTree is a state's files, kept from the GC until release.
type heldTree struct {
	*stateTree
	free func()
}

func (h heldTree) release() { h.Close(); h.free() }

func (d *stateDiffs) tree(sid string) (heldTree, error) {
	dir, free, err := d.c.StateFiles(sid)
	if err != nil {
		return heldTree{}, err
	}
	t, err := openStateTree(dir)
	if err != nil {
		free()
		return heldTree{}, err
	}
	return heldTree{t, free}, nil
}

const noteBounds = "past the diff's bounds"

// compare describes one changed path and diffs its text, within the
// answer's budget of diff bytes and of files compared.
func compare(ta, tb *stateTree, ch coordinator.FileChange, budget, compared *int) (FileDiff, error) {
	f := FileDiff{Path: ch.Path, Change: ch.Kind}
	ea, err := ta.stat(ch.Path)
	if err != nil {
		return f, err
	}
	eb, err := tb.stat(ch.Path)
	if err != nil {
		return f, err
	}
	if ea.Exists {
		f.TypeA, f.SizeA, f.LinkA = ea.Type, ea.Size, ea.Link
	}
	if eb.Exists {
		f.TypeB, f.SizeB, f.LinkB = eb.Type, eb.Size, eb.Link
	}
	if ea.Through || eb.Through {
		f.Note = "through a symbolic link"
		return f, nil
	}
	// Text diffs are of regular files (one side may be absent).
	if ea.Exists && ea.Type != "file" || eb.Exists && eb.Type != "file" || !ea.Exists && !eb.Exists {
		return f, nil
	}
	if *compared >= diffMaxFiles || *budget <= 0 {
		f.Note = noteBounds
		return f, nil
	}
	*compared++
	var text [2][]byte
	for i, side := range []struct {
		t *stateTree
		e entry
	}{{ta, ea}, {tb, eb}} {
		if !side.e.Exists {
			continue
		}
		b, tooLarge, err := side.t.read(ch.Path, diffMaxFileBytes)
		if err != nil {
			return f, err
		}
		if tooLarge {
			f.Note = "too large"
			return f, nil
		}
		text[i] = b
	}
	if isBinary(text[0]) || isBinary(text[1]) {
		f.Binary, f.Note = true, "binary"
		return f, nil
	}
	na, nb := "a"+ch.Path, "b"+ch.Path
	if !ea.Exists {
		na = "/dev/null"
	}
	if !eb.Exists {
		nb = "/dev/null"
	}
	u := unified(na, nb, string(text[0]), string(text[1]))
	if len(u) > *budget {
		f.Note = noteBounds
		*budget = 0
		return f, nil
	}
	*budget -= len(u)
	f.Diff = u
	return f, nil
}

// isBinary: a NUL byte or text that is not UTF-8.
func isBinary(b []byte) bool {
	for _, c := range b {
		if c == 0 {
			return true
		}
	}
	return !utf8.Valid(b)
}
