package benchmarks

import (
	"context"
	"fmt"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/shcmd"
	"github.com/arbor-env/arbor/state"
)

// Turn is one action of a played trace, as one mode saw it.
type Turn struct {
	Index   int    `json:"index"`
	Setup   bool   `json:"setup,omitempty"`
	Label   string `json:"label"`
	Expect  string `json:"expect,omitempty"`
	Class   string `json:"class"`
	StateID string `json:"state_id,omitempty"`
	// StepMS is the step's latency as the client saw it (including any
	// wait for the previous turn's checkpoint), ExecMS the command's own.
	StepMS float64 `json:"step_ms"`
	ExecMS float64 `json:"exec_ms"`
	// CkptMS is the checkpoint this turn queued (0 for none); ExposedMS
	// the part of it that the think time did not hide.
	CkptMS    float64 `json:"ckpt_ms"`
	ExposedMS float64 `json:"exposed_ms"`
	// Dumped: the turn's checkpoint dumped the processes with CRIU (a
	// proc or full checkpoint that is not a shell delta).
	Dumped bool `json:"dumped,omitempty"`

	ref StateDigest
	// Recovery: restoring this turn's state, and whether it equals the
	// state recorded live at the turn.
	RestoreMS float64  `json:"restore_ms,omitempty"`
	Checked   bool     `json:"checked,omitempty"`
	Recovered bool     `json:"recovered,omitempty"`
	Mismatch  []string `json:"mismatch,omitempty"`
}

// TraceRun is one trace played in one mode.
type TraceRun struct {
	Trace string `json:"trace"`
	Mode  string `json:"mode"`
	Turns []Turn `json:"turns"`
	// ProcBytes and ProcImages are the CRIU images written; FSSnapshots
	// the file-system snapshots taken.
	ProcBytes   int64 `json:"proc_bytes"`
	ProcImages  int   `json:"proc_images"`
	FSSnapshots int   `json:"fs_snapshots"`
	// Recovery is the same trace played again (no think time) with the
	// state probed live after every turn, then every turn restored.
	Recovery []Turn `json:"recovery,omitempty"`
}

func toAction(a Action) arbor.Action {
	switch {
	case a.WriteFile != "":
		return arbor.WriteFile(a.WriteFile, []byte(a.Content))
	case a.ReadFile != "":
		return arbor.ReadFile(a.ReadFile)
	}
	return arbor.Bash(a.Bash, 2*time.Minute)
}

// shellCmd is the command a direct (serverless) baseline runs for a: the
// same one the server runs for that tool.
func shellCmd(a Action) string {
	switch {
	case a.WriteFile != "":
		return shcmd.WriteFile(a.WriteFile, []byte(a.Content))
	case a.ReadFile != "":
		return shcmd.ReadFile(a.ReadFile)
	}
	return a.Bash
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// playServer plays tr through a server. With probe, there is no think
// time and every turn's state is recorded once its checkpoint is done;
// otherwise turns are separated by think and checkpoint timings are read
// from the manifest afterwards. It returns the env, left open.
func (r *rig) playServer(ctx context.Context, h *serverHandle, tr Trace, think time.Duration, probeTurns bool) (string, []Turn, error) {
	rr, err := h.c.Reset(ctx, arbor.ResetParams{Image: tr.Image})
	if err != nil {
		return "", nil, fmt.Errorf("%w: reset %s: %v", ErrStep, tr.Image, err)
	}
	envID := rr.EnvID
	env, err := h.e.Env(envID)
	if err != nil {
		return envID, nil, err
	}
	acts := tr.All()
	turns := make([]Turn, len(acts))
	recv := make([]time.Time, len(acts))
	deadline := time.Now()
	for i, a := range acts {
		setup := i < len(tr.Setup)
		if !setup && !probeTurns {
			time.Sleep(time.Until(deadline))
		}
		send := time.Now()
		res, err := h.c.Step(ctx, envID, toAction(a))
		if err != nil {
			return envID, nil, fmt.Errorf("%w: %s turn %d (%s): %v", ErrStep, tr.Name, i, a.Label(), err)
		}
		recv[i] = time.Now()
		deadline = recv[i].Add(think)
		turns[i] = Turn{Index: i, Setup: setup, Label: a.Label(), Expect: a.Expect, Class: res.Info.Checkpoint,
			StateID: res.Info.StateID, StepMS: ms(recv[i].Sub(send)), ExecMS: res.Obs.DurationS * 1000}
		if probeTurns {
			if _, err := h.e.Checkpoint(ctx, env, state.None); err != nil {
				return envID, nil, fmt.Errorf("wait for checkpoint of turn %d: %w", i, err)
			}
			if turns[i].ref, err = probe(ctx, env.Sandbox()); err != nil {
				return envID, nil, err
			}
		}
	}
	// Wait for the last checkpoint, then read every checkpoint's timing.
	if _, err := h.e.Checkpoint(ctx, env, state.None); err != nil {
		return envID, nil, fmt.Errorf("wait for last checkpoint: %w", err)
	}
	for i := range turns {
		t := &turns[i]
		if t.Class == string(state.None) || t.StateID == "" {
			continue
		}
		st, err := h.e.State(t.StateID)
		if err != nil {
			continue
		}
		total := st.Timings["total"]
		t.CkptMS = ms(total)
		// The kind taken: the Inspector may grow it while frozen.
		t.Class = string(st.Kind)
		t.Dumped = st.Dumped()
		if !probeTurns {
			end := st.Created.Add(total)
			if ex := end.Sub(recv[i].Add(think)); ex > 0 {
				t.ExposedMS = ms(ex)
			}
		}
	}
	return envID, turns, nil
}

// recoverServer restores every turn's state through branch(1) and compares
// it with the reference recorded live.
func (r *rig) recoverServer(ctx context.Context, h *serverHandle, turns []Turn) error {
	cache := map[string]struct {
		d  StateDigest
		ms float64
	}{}
	for i := range turns {
		t := &turns[i]
		got, ok := cache[t.StateID]
		if !ok {
			start := time.Now()
			br, err := h.c.Branch(ctx, arbor.BranchParams{StateID: t.StateID, N: 1})
			if err != nil {
				return fmt.Errorf("branch state %s of turn %d: %w", t.StateID, i, err)
			}
			got.ms = ms(time.Since(start))
			if len(br.EnvIDs) != 1 || br.EnvIDs[0] == "" {
				return fmt.Errorf("branch state %s of turn %d: %v", t.StateID, i, br.Errors)
			}
			child, err := h.e.Env(br.EnvIDs[0])
			if err != nil {
				return err
			}
			got.d, err = probe(ctx, child.Sandbox())
			h.c.CloseEnv(ctx, br.EnvIDs[0])
			if err != nil {
				return err
			}
			cache[t.StateID] = got
		}
		t.RestoreMS, t.Checked = got.ms, true
		t.Mismatch = got.d.Diff(t.ref)
		t.Recovered = len(t.Mismatch) == 0
	}
	return nil
}

// direct is a sandbox the serverless baselines drive themselves.
type direct struct {
	le *launch.Env
	r  *rig
}

func (r *rig) launchDirect(ctx context.Context, img string) (*direct, error) {
	le, err := r.launch.Launch(ctx, img)
	if err != nil {
		return nil, err
	}
	return &direct{le: le, r: r}, nil
}

func (d *direct) exec(ctx context.Context, a Action) (*sandbox.Result, error) {
	res, err := d.le.Sandbox.Exec(ctx, shellCmd(a), sandbox.ExecOptions{Timeout: 2 * time.Minute})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrStep, a.Label(), err)
	}
	return res, nil
}

func (d *direct) close() {
	if err := d.le.Close(context.Background()); err != nil {
		d.r.log.Warn("close baseline sandbox", "err", err)
	}
}

// playFSOnly is the "chat + files" baseline: after every turn a snapshot
// of the files, nothing of the processes. With probe the state is recorded
// after every turn (no think time).
func (r *rig) playFSOnly(ctx context.Context, tr Trace, think time.Duration, probeTurns bool) ([]Turn, []string, error) {
	d, err := r.launchDirect(ctx, tr.Image)
	if err != nil {
		return nil, nil, err
	}
	defer d.close()
	acts := tr.All()
	turns := make([]Turn, len(acts))
	snaps := make([]string, len(acts))
	deadline := time.Now()
	for i, a := range acts {
		setup := i < len(tr.Setup)
		if !setup && !probeTurns {
			time.Sleep(time.Until(deadline))
		}
		send := time.Now()
		res, err := d.exec(ctx, a)
		if err != nil {
			return nil, snaps, err
		}
		recv := time.Now()
		// The snapshot runs while the model thinks; what exceeds the think
		// time is exposed.
		name := fmt.Sprintf("bench/fsonly/%s-%d", d.le.ID, i)
		t0 := time.Now()
		if err := r.snap.Snapshot(ctx, d.le.Volume, name); err != nil {
			return nil, snaps, fmt.Errorf("snapshot files: %w", err)
		}
		ck := time.Since(t0)
		snaps[i] = name
		deadline = recv.Add(max(think, ck))
		turns[i] = Turn{Index: i, Setup: setup, Label: a.Label(), Expect: a.Expect, Class: "fs", StateID: name,
			StepMS: ms(recv.Sub(send)), ExecMS: ms(res.Duration), CkptMS: ms(ck)}
		if ck > think {
			turns[i].ExposedMS = ms(ck - think)
		}
		if probeTurns {
			if turns[i].ref, err = probe(ctx, d.le.Sandbox); err != nil {
				return nil, snaps, err
			}
		}
	}
	return turns, snaps, nil
}

// recoverFSOnly restores each snapshot the way a files-only system does:
// a fresh sandbox with a new shell on a clone of the snapshot.
func (r *rig) recoverFSOnly(ctx context.Context, turns []Turn, snaps []string) error {
	for i := range turns {
		t := &turns[i]
		start := time.Now()
		id := state.NewID("")
		vol := launch.VolumePrefix + "fsonly-" + id
		if err := r.snap.Clone(ctx, snaps[i], vol); err != nil {
			return fmt.Errorf("clone %s: %w", snaps[i], err)
		}
		sb, err := sandbox.Start(ctx, sandbox.Config{ID: "fsonly-" + id, Root: r.snap.Path(vol), InitBinary: r.o.InitBinary, Logger: r.log})
		if err != nil {
			r.snap.Destroy(ctx, vol)
			return fmt.Errorf("start sandbox on %s: %w", snaps[i], err)
		}
		t.RestoreMS = ms(time.Since(start))
		got, err := probe(ctx, sb)
		sb.Destroy(ctx)
		r.snap.Destroy(ctx, vol)
		if err != nil {
			return err
		}
		t.Checked = true
		t.Mismatch = got.Diff(t.ref)
		t.Recovered = len(t.Mismatch) == 0
	}
	for _, s := range snaps {
		if s != "" {
			r.snap.Destroy(ctx, s)
		}
	}
	return nil
}

// playReplay records the reference states of a plain run (no
// checkpoints); recoverReplay then reaches each turn's state by starting
// afresh and replaying the actions up to it.
func (r *rig) playReplay(ctx context.Context, tr Trace) ([]Turn, error) {
	d, err := r.launchDirect(ctx, tr.Image)
	if err != nil {
		return nil, err
	}
	defer d.close()
	acts := tr.All()
	turns := make([]Turn, len(acts))
	for i, a := range acts {
		send := time.Now()
		res, err := d.exec(ctx, a)
		if err != nil {
			return nil, err
		}
		turns[i] = Turn{Index: i, Setup: i < len(tr.Setup), Label: a.Label(), Expect: a.Expect, Class: "none",
			StepMS: ms(time.Since(send)), ExecMS: ms(res.Duration)}
		if turns[i].ref, err = probe(ctx, d.le.Sandbox); err != nil {
			return nil, err
		}
	}
	return turns, nil
}

func (r *rig) recoverReplay(ctx context.Context, tr Trace, turns []Turn, stride int) error {
	acts := tr.All()
	for i := range turns {
		if (len(turns)-1-i)%stride != 0 {
			continue
		}
		t := &turns[i]
		start := time.Now()
		d, err := r.launchDirect(ctx, tr.Image)
		if err != nil {
			return err
		}
		for _, a := range acts[:i+1] {
			if _, err := d.exec(ctx, a); err != nil {
				d.close()
				return err
			}
		}
		t.RestoreMS = ms(time.Since(start))
		got, err := probe(ctx, d.le.Sandbox)
		d.close()
		if err != nil {
			return err
		}
		t.Checked = true
		t.Mismatch = got.Diff(t.ref)
		t.Recovered = len(t.Mismatch) == 0
	}
	return nil
}
