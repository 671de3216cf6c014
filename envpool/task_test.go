package envpool_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/state"
)

func TestLoadTask(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		body    string
		want    envpool.Task
		wantErr string
	}{
		{name: "yaml with seconds", file: "a.yaml", body: "image: busybox\nsetup: [echo hi]\nverifier: 'true'\nmax_turns: 3\ncommand_timeout: 2.5\nenv: {K: v}\n",
			want: envpool.Task{Name: "a", Image: "busybox", Setup: []string{"echo hi"}, Verifier: "true", MaxTurns: 3,
				CommandTimeout: 2500 * time.Millisecond, Env: map[string]string{"K": "v"}}},
		{name: "yaml with duration string", file: "b.yml", body: "name: bee\nimage: debian\ncommand_timeout: 2m\n",
			want: envpool.Task{Name: "bee", Image: "debian", CommandTimeout: 2 * time.Minute}},
		{name: "json with string timeout", file: "c.json", body: `{"image": "busybox", "instruction": "do it", "command_timeout": "90s"}`,
			want: envpool.Task{Name: "c", Image: "busybox", Instruction: "do it", CommandTimeout: 90 * time.Second}},
		{name: "json with number timeout", file: "d.json", body: `{"image": "busybox", "command_timeout": 7}`,
			want: envpool.Task{Name: "d", Image: "busybox", CommandTimeout: 7 * time.Second}},
		{name: "verifier keeps processes", file: "k.yaml", body: "image: busybox\nverifier: 'true'\nverifier_keeps_processes: true\n",
			want: envpool.Task{Name: "k", Image: "busybox", Verifier: "true", VerifierKeepsProcesses: true}},
		{name: "verifier keeps processes in json", file: "k2.json", body: `{"image": "busybox", "verifier": "true", "verifier_keeps_processes": true}`,
			want: envpool.Task{Name: "k2", Image: "busybox", Verifier: "true", VerifierKeepsProcesses: true}},
		{name: "misspelt field", file: "e.yaml", body: "image: busybox\nverifer: 'true'\n", wantErr: "verifer"},
		{name: "unknown json field", file: "f.json", body: `{"image": "busybox", "maxturns": 3}`, wantErr: "maxturns"},
		{name: "no image", file: "g.yaml", body: "setup: [ls]\n", wantErr: "image: required"},
		{name: "bad name", file: "h.yaml", body: "name: 'a b'\nimage: busybox\n", wantErr: `name "a b"`},
		{name: "bad env key", file: "i.yaml", body: "image: busybox\nenv: {'1X': v}\n", wantErr: "not a shell variable name"},
		{name: "negative turns", file: "j.yaml", body: "image: busybox\nmax_turns: -1\n", wantErr: "max_turns -1"},
		{name: "bad timeout", file: "k.yaml", body: "image: busybox\ncommand_timeout: soon\n", wantErr: "duration \"soon\""},
		{name: "empty setup command", file: "l.yaml", body: "image: busybox\nsetup: ['  ']\n", wantErr: "setup[0]: empty"},
		{name: "wrong extension", file: "m.toml", body: "image = 'busybox'\n", wantErr: "want .yaml"},
		{name: "fewer caps", file: "n.yaml", body: "image: busybox\ncaps: [CAP_CHOWN, kill]\n",
			want: envpool.Task{Name: "n", Image: "busybox", Caps: []string{"CAP_CHOWN", "kill"}}},
		{name: "unknown cap", file: "o.yaml", body: "image: busybox\ncaps: [CAP_FLY]\n", wantErr: `caps: sandbox isolation check failed: unknown capability "CAP_FLY"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tt.file)
			if err := os.WriteFile(path, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := envpool.LoadTask(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, envpool.ErrInvalidTask) {
					t.Fatalf("err = %v, want ErrInvalidTask mentioning %q", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("err %v does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tt.want)
			if string(gj) != string(wj) {
				t.Errorf("got %s\nwant %s", gj, wj)
			}
		})
	}
}

func TestTaskJSONRoundTrip(t *testing.T) {
	in := envpool.Task{Name: "x", Image: "busybox", CommandTimeout: 1500 * time.Millisecond, Env: map[string]string{"A": "b"}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"command_timeout":1.5`) {
		t.Errorf("timeout not written as seconds: %s", b)
	}
	var out envpool.Task
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.CommandTimeout != in.CommandTimeout || out.Env["A"] != "b" || out.Name != "x" {
		t.Errorf("round trip: %+v", out)
	}
}

func TestShippedTasks(t *testing.T) {
	tasks, err := envpool.LoadTasks(filepath.Join("..", "tasks"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]envpool.Task{}
	for _, tk := range tasks {
		names[tk.Name] = tk
	}
	for _, want := range []string{"hello", "sort-numbers", "python-fizzbuzz"} {
		if _, ok := names[want]; !ok {
			t.Errorf("tasks/ lacks %s (have %v)", want, names)
		}
	}
	if names["hello"].Image != "busybox" {
		t.Errorf("the default task must run on busybox: %+v", names["hello"])
	}
}

func TestLoadTasksReportsEveryBadFileAndDuplicates(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.yaml":     "name: same\nimage: busybox\n",
		"b.json":     `{"name": "same", "image": "busybox"}`,
		"c.yaml":     "image: ''\n",
		"notes.txt":  "ignored",
		"good.yaml":  "image: busybox\n",
		"other.yaml": "image: [oops\n",
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := envpool.LoadTasks(dir)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`"same" used by both`, "c.yaml", "other.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestReward(t *testing.T) {
	auto := envpool.Task{}
	wide := envpool.Task{RewardRange: [2]float64{-5, 5}}
	stdout := envpool.Task{RewardFrom: envpool.RewardStdout}
	status := envpool.Task{RewardFrom: envpool.RewardExitStatus, RewardRange: [2]float64{-1, 2}}
	rubric := envpool.Task{Rubric: map[string]float64{"tests": 0.75, "style": 0.25}}
	fiveParts := envpool.Task{Rubric: map[string]float64{"static": 0.25, "spa": 0.2, "api": 0.3, "headers": 0.1, "dotfiles": 0.15}}
	tests := []struct {
		name     string
		task     envpool.Task
		stdout   string
		exit     int
		timedOut bool
		want     float64
		wantFrom string
		wantErr  bool
	}{
		{name: "exit 0", task: auto, stdout: "all good\n", exit: 0, want: 1, wantFrom: "exit_status"},
		{name: "exit 1", task: auto, stdout: "", exit: 1, want: 0, wantFrom: "exit_status"},
		{name: "number wins", task: auto, stdout: "checking\n0.75\n", exit: 0, want: 0.75, wantFrom: "stdout"},
		{name: "number with failing status", task: auto, stdout: "0.25\n\n", exit: 3, want: 0.25, wantFrom: "stdout"},
		{name: "number not last", task: auto, stdout: "0.5\ndone\n", exit: 2, want: 0, wantFrom: "exit_status"},
		{name: "timeout", task: auto, stdout: "1\n", exit: 124, timedOut: true, want: 0, wantFrom: "timeout"},
		{name: "nan is an error", task: auto, stdout: "NaN\n", exit: 0, wantErr: true},
		{name: "inf is an error", task: auto, stdout: "+Inf\n", exit: 1, wantErr: true},
		{name: "overflow is an error", task: auto, stdout: "1e999\n", exit: 0, wantErr: true},
		{name: "huge is out of range", task: auto, stdout: "1000000.0\n", exit: 0, wantErr: true},
		{name: "negative is out of range", task: auto, stdout: "-2\n", exit: 0, wantErr: true},
		{name: "negative in a wide range", task: wide, stdout: "-2\n", exit: 0, want: -2, wantFrom: "stdout"},
		{name: "wide range's exit status", task: wide, stdout: "ok\n", exit: 0, want: 5, wantFrom: "exit_status"},
		{name: "stdout needs a number", task: stdout, stdout: "PASSED\n", exit: 0, wantErr: true},
		{name: "stdout number", task: stdout, stdout: "0.5\n", exit: 1, want: 0.5, wantFrom: "stdout"},
		{name: "exit status ignores numbers", task: status, stdout: "1e6\n", exit: 0, want: 2, wantFrom: "exit_status"},
		{name: "exit status failed", task: status, stdout: "1\n", exit: 1, want: -1, wantFrom: "exit_status"},
		{name: "rubric", task: rubric, stdout: "log\n\n" + `{"tests": 1, "style": 0.5}` + "\n", want: 0.875, wantFrom: "rubric"},
		{name: "rubric missing part", task: rubric, stdout: `{"tests": 1}`, wantErr: true},
		{name: "rubric extra part", task: rubric, stdout: `{"tests": 1, "style": 1, "bonus": 1}`, wantErr: true},
		{name: "rubric not a number", task: rubric, stdout: `{"tests": "1", "style": 1}`, wantErr: true},
		{name: "rubric garbage", task: rubric, stdout: "1.0\n", wantErr: true},
		{name: "rubric out of range", task: rubric, stdout: `{"tests": 2, "style": 2}`, wantErr: true},
		// The shipped nginx task's weights: their sum rounds to
		// 1.0000000000000002 in some orders; full marks are 1.
		{name: "rubric whose weights round", task: fiveParts, stdout: `{"static": 1, "spa": 1, "api": 1, "headers": 1, "dotfiles": 1}`, want: 1, wantFrom: "rubric"},
		{name: "rubric just out of range", task: fiveParts, stdout: `{"static": 1.00001, "spa": 1, "api": 1, "headers": 1, "dotfiles": 1}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.task.Score(tt.stdout, tt.exit, tt.timedOut)
			if tt.wantErr {
				if !errors.Is(err, state.ErrVerifierOutput) {
					t.Errorf("Score(%q, %d) = %+v, %v; want a verifier_error", tt.stdout, tt.exit, got, err)
				} else {
					t.Logf("%v", err)
				}
				return
			}
			if err != nil || got.Reward != tt.want || got.From != tt.wantFrom {
				t.Errorf("Score(%q, %d) = %+v, %v; want %v from %s", tt.stdout, tt.exit, got, err, tt.want, tt.wantFrom)
			}
		})
	}
}
