package benchmarks

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// RuncResult is the runc baseline: `runc checkpoint --leave-running` of a
// container equivalent to an Arbor sandbox (the debian image's files as
// rootfs, a bash shell and the trace's background server), and branch(n)
// as n parallel `runc restore -d`, each into its own btrfs clone of the
// rootfs snapshot taken with the checkpoint.
type RuncResult struct {
	Available    bool              `json:"available"`
	Note         string            `json:"note,omitempty"`
	CheckpointMS []float64         `json:"checkpoint_ms,omitempty"`
	ImageBytes   int64             `json:"image_bytes,omitempty"`
	BranchMS     map[int][]float64 `json:"branch_ms,omitempty"`
	BranchErrors int               `json:"branch_errors,omitempty"`
}

type runc struct {
	bin, criu string
	dir       string
}

func (rc runc) cmd(ctx context.Context, args ...string) error {
	// Detached containers inherit runc's stdio: a pipe there would keep
	// Wait from returning, and CRIU wants them inside the container, so
	// they are /dev/null and runc's errors go to its log file.
	logf := filepath.Join(rc.dir, "runc.log")
	c := exec.CommandContext(ctx, rc.bin, append([]string{"--criu", rc.criu, "--log", logf}, args...)...)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	c.Stdin, c.Stdout, c.Stderr = null, null, null
	if err := c.Run(); err != nil {
		b, _ := os.ReadFile(logf)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return fmt.Errorf("runc %s: %v: %s", args[0], err, lines[len(lines)-1])
	}
	return nil
}

func (rc runc) remove(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	exec.CommandContext(ctx, rc.bin, "kill", id, "KILL").Run()
	exec.CommandContext(ctx, rc.bin, "delete", "-f", id).Run()
}

// bundle writes an OCI bundle whose root is rootfs.
func (rc runc) bundle(ctx context.Context, name, rootfs string) (string, error) {
	dir := filepath.Join(rc.dir, "bundles", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	c := exec.CommandContext(ctx, rc.bin, "spec", "--bundle", dir)
	if out, err := c.CombinedOutput(); err != nil {
		return "", fmt.Errorf("runc spec: %v: %s", err, out)
	}
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", err
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["cwd"] = "/srv/app"
	proc["args"] = []string{"bash", "-c", "cd /srv/app && export APP_MODE=debug && python3 counter_server.py 8000 >/dev/null 2>&1 & wait"}
	spec["root"] = map[string]any{"path": rootfs, "readonly": false}
	b, err = json.MarshalIndent(spec, "", " ")
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(p, b, 0o644)
}

// runcBench measures the runc baseline; a host without runc gets a note.
func (r *rig) runcBench(ctx context.Context, ns []int, reps int) (res *RuncResult) {
	res = &RuncResult{BranchMS: map[int][]float64{}}
	bin, err := exec.LookPath("runc")
	if err != nil {
		res.Note = "runc not installed"
		return res
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		res.Note = "iptables not installed (runc's default network lock needs it)"
		return res
	}
	rc := runc{bin: bin, criu: r.criu.Path(), dir: filepath.Join(r.dir, "runc")}
	if err := os.MkdirAll(rc.dir, 0o755); err != nil {
		res.Note = err.Error()
		return res
	}
	if err := r.runcMeasure(ctx, rc, ns, reps, res); err != nil {
		res.Note = err.Error()
		return res
	}
	res.Available = true
	res.Note = "runc checkpoint dumps processes only (no file snapshot); branch clones the rootfs snapshot on btrfs, then runc restore; restored containers come back with loopback down (runc does not bring it up in the new netns)"
	return res
}

func (r *rig) runcMeasure(ctx context.Context, rc runc, ns []int, reps int, res *RuncResult) error {
	img, err := r.images.Get(ctx, "debian")
	if err != nil {
		return err
	}
	base := "bench/runc/base"
	if err := r.snap.Clone(ctx, img.Snapshot, base); err != nil {
		return fmt.Errorf("clone image: %w", err)
	}
	defer r.snap.Destroy(context.Background(), base)
	traces, _ := LoadTraces("", []string{"service"})
	var server string
	for _, a := range traces[0].Setup {
		if a.WriteFile == "/srv/app/counter_server.py" {
			server = a.Content
		}
	}
	root := r.snap.Path(base)
	if err := os.MkdirAll(filepath.Join(root, "srv/app"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "srv/app/counter_server.py"), []byte(server), 0o644); err != nil {
		return err
	}
	bdir, err := rc.bundle(ctx, "base", root)
	if err != nil {
		return err
	}
	id := "arbor-bench-base"
	if err := rc.cmd(ctx, "run", "-d", "--bundle", bdir, id); err != nil {
		return err
	}
	defer rc.remove(id)
	time.Sleep(500 * time.Millisecond) // let the server listen
	// Checkpoints, as a checkpoint-every-turn user of runc would take them.
	var last string
	for i := 0; i < reps+1; i++ {
		imgDir := filepath.Join(rc.dir, fmt.Sprintf("ckpt-%d", i))
		t := time.Now()
		if err := rc.cmd(ctx, "checkpoint", "--leave-running", "--image-path", imgDir, "--work-path", imgDir+"-work", id); err != nil {
			return err
		}
		if i > 0 { // the first one pays CRIU's one-time kernel probing
			res.CheckpointMS = append(res.CheckpointMS, ms(time.Since(t)))
		}
		last = imgDir
	}
	res.ImageBytes = dirBytes(last)
	snap := "bench/runc/snap"
	if err := r.snap.Snapshot(ctx, base, snap); err != nil {
		return err
	}
	defer r.snap.Destroy(context.Background(), snap)
	for _, n := range ns {
		for rep := 0; rep < reps; rep++ {
			d, errs := r.runcBranch(ctx, rc, last, snap, n, rep)
			res.BranchErrors += errs
			res.BranchMS[n] = append(res.BranchMS[n], ms(d))
		}
	}
	return nil
}

// runcBranch restores n containers from one checkpoint in parallel and
// returns the time until all run.
func (r *rig) runcBranch(ctx context.Context, rc runc, imgDir, snap string, n, rep int) (time.Duration, int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := 0
	var made []func()
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("b%d-%d-%d", n, rep, i)
			vol := "bench/runc/" + name
			err := r.snap.Clone(ctx, snap, vol)
			var bdir string
			if err == nil {
				bdir, err = rc.bundle(ctx, name, r.snap.Path(vol))
			}
			id := "arbor-bench-" + name
			if err == nil {
				err = rc.cmd(ctx, "restore", "-d", "--image-path", imgDir, "--work-path", filepath.Join(rc.dir, "work-"+name),
					"--bundle", bdir, id)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				r.log.Warn("runc restore", "err", err)
			}
			made = append(made, func() {
				rc.remove(id)
				r.snap.Destroy(context.Background(), vol)
			})
		}(i)
	}
	wg.Wait()
	d := time.Since(start)
	for _, f := range made {
		f()
	}
	return d, errs
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
