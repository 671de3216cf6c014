package criu_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// TestRestoreRefusesAttributeItCannotGiveBack: a recorded attribute the
// restored task does not come out with (a CPU this host does not have,
// speculation control or KSM merging of a whole process, which nothing sets from outside) fails the restore
// with state.ErrUnrestorableState naming the task and the attribute,
// instead of handing out a copy that differs; the images as recorded
// restore.
func TestRestoreRefusesAttributeItCannotGiveBack(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	sb := startSource(t, snap, "crattrs", sandboxtest.BusyboxRoot(t, ""))
	if r, err := sb.Exec(ctx, `sleep 1000 </dev/null >/dev/null 2>&1 & until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done`, sandbox.ExecOptions{}); err != nil || r.ExitCode != 0 {
		t.Fatalf("start daemon: %v %+v", err, r)
	}
	imgs := t.TempDir()
	_, rec := dump(t, c, snap, sb, "snap1", imgs, false)
	recorded, err := os.ReadFile(filepath.Join(imgs, "arbor-attrs.json"))
	if err != nil {
		t.Fatalf("the dump recorded no attributes: %v", err)
	}
	for i, tt := range []struct {
		name string
		edit func(task map[string]any)
		want string // in the error; "" restores
	}{
		{"as recorded", func(map[string]any) {}, ""},
		{"a CPU the host lacks", func(task map[string]any) { task["affinity"] = []int{0, 1000} }, "CPU affinity 0,1000"},
		{"KSM of the whole process", func(task map[string]any) {
			task["fixed"] = map[string]string{"ksm_merge_any": "yes"}
		}, `ksm_merge_any "yes"`},
		{"speculation control", func(task map[string]any) {
			task["fixed"] = map[string]string{"Speculation_Store_Bypass": "thread force mitigated"}
		}, `Speculation_Store_Bypass "thread force mitigated"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r struct {
				Tasks []map[string]any `json:"tasks"`
			}
			if err := json.Unmarshal(recorded, &r); err != nil {
				t.Fatal(err)
			}
			var daemon map[string]any
			for _, task := range r.Tasks {
				if task["tid"] == task["pid"] && task["tid"].(float64) > 2 {
					daemon = task // the shell's child, after init and the shell
				}
			}
			if daemon == nil {
				t.Fatalf("no daemon in the record %s", recorded)
			}
			tt.edit(daemon)
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(imgs, "arbor-attrs.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			vol := fmt.Sprintf("child%d", i)
			if err := snap.Clone(ctx, "snap1", vol); err != nil {
				t.Fatal(err)
			}
			child, err := sandbox.Restore(ctx, sandbox.Config{ID: "crattrs" + vol, Root: snap.Path(vol)}, rec, func(join func(int) error) (int, error) {
				return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: snap.Path(vol), Join: join})
			})
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				child.Destroy(ctx)
				return
			}
			if err == nil {
				child.Destroy(ctx)
				t.Fatalf("restore with %s recorded succeeded", tt.want)
			}
			if !errors.Is(err, state.ErrUnrestorableState) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "(sleep)") {
				t.Fatalf("restore: %v; want state.ErrUnrestorableState naming %s of the sleep", err, tt.want)
			}
			// Nothing of the refused tree is left running.
			procs, _ := filepath.Glob("/proc/[0-9]*/root")
			for _, p := range procs {
				if root, err := os.Readlink(p); err == nil && root == snap.Path(vol) {
					t.Errorf("%s of the refused restore still runs", filepath.Dir(p))
				}
			}
		})
	}
}

// BenchmarkDumpExtras: what a dump and a restore spend, besides CRIU, on
// what CRIU does not carry, for a sandbox of init (a Go program and its
// threads), the shell and a daemon: listing the IPC namespace's POSIX
// message queues and the descriptors CRIU cannot dump, recording the
// tasks' attributes, and reading them back after a restore when nothing
// differs (the common case): at post-restore what Arbor sets, once CRIU
// is done what nothing sets.
func BenchmarkDumpExtras(b *testing.B) {
	_, snap := setup(b)
	ctx := context.Background()
	sb := startSource(b, snap, "crextras", sandboxtest.BusyboxRoot(b, ""))
	if r, err := sb.Exec(ctx, `sleep 1000 </dev/null >/dev/null 2>&1 & until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done`, sandbox.ExecOptions{}); err != nil || r.ExitCode != 0 {
		b.Fatalf("start daemon: %v %+v", err, r)
	}
	pid, dir := sb.InitPID(), b.TempDir()
	b.Run("refuse-unrestorable", func(b *testing.B) {
		for b.Loop() {
			if err := criu.RefuseUnrestorable(pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("record", func(b *testing.B) {
		for b.Loop() {
			if err := criu.RecordAttrs(dir, pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("apply-unchanged", func(b *testing.B) {
		for b.Loop() {
			if err := criu.ApplyAttrs(dir, pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("check-fixed", func(b *testing.B) {
		for b.Loop() {
			if err := criu.CheckFixed(dir, pid); err != nil {
				b.Fatal(err)
			}
		}
	})
}
