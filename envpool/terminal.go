package envpool

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// TerminalTask is a task imported from a terminal-task directory: the
// task, and the directory whose contents are its hidden files (the
// task's tests and their runner), to be copied beside the task file.
type TerminalTask struct {
	Task Task
	// Tests is the source of the hidden files: the task directory's
	// tests/, plus its run-tests.sh.
	Tests string
	// RunTests is the runner script of the older layout (copied into the
	// hidden files beside the tests), "" in the newer one.
	RunTests string
}

// ImportTerminalTask reads a task directory in the layout terminal-agent
// benchmarks publish (docs/tasks.md, "Terminal-task directories"), on
// image (an OCI reference: the Dockerfile is not built here):
//
//   - older layout: task.yaml (instruction, or descriptions[key=base];
//     difficulty, tags, category, max_test_timeout_sec), run-tests.sh
//     (run with TEST_DIR=/tests), tests/, optional solution.sh;
//   - newer layout: instruction.md, tests/test.sh (which writes the
//     reward to /logs/verifier/reward.txt), optional solution/solve.sh.
//
// The tests become hidden files at /tests, copied in only by the trusted
// grader; the agent's work is the image's working directory (where the
// shell starts).
func ImportTerminalTask(dir, image, name string) (TerminalTask, error) {
	if name == "" {
		name = filepath.Base(filepath.Clean(dir))
	}
	t := Task{Name: name, Image: image, HiddenPath: "/tests", Tags: []string{"terminal"}}
	tt := TerminalTask{Tests: filepath.Join(dir, "tests")}
	if st, err := os.Stat(tt.Tests); err != nil || !st.IsDir() {
		return tt, fmt.Errorf("%w: %s: no tests/ directory", ErrInvalidTask, dir)
	}
	read := func(rel string) (string, bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		if errors.Is(err, fs.ErrNotExist) {
			return "", false, nil
		}
		return string(b), err == nil, err
	}
	if md, ok, err := read("instruction.md"); err != nil {
		return tt, err
	} else if ok {
		// The newer layout.
		t.Instruction = strings.TrimSpace(md) + "\n"
		if _, ok, _ := read("tests/test.sh"); !ok {
			return tt, fmt.Errorf("%w: %s: instruction.md but no tests/test.sh", ErrInvalidTask, dir)
		}
		t.Verifier = "mkdir -p /logs/verifier && rm -f /logs/verifier/reward.txt\n" +
			"$(command -v bash || echo sh) /tests/test.sh >&2\n" +
			"r=$(cat /logs/verifier/reward.txt 2>/dev/null)\n" +
			"echo \"${r:-0}\"\n"
		t.RewardFrom = RewardStdout
		if sol, ok, err := read("solution/solve.sh"); err != nil {
			return tt, err
		} else if ok {
			t.Solution = sol
		}
	} else {
		y, ok, err := read("task.yaml")
		if err != nil {
			return tt, err
		}
		if !ok {
			return tt, fmt.Errorf("%w: %s: neither task.yaml nor instruction.md", ErrInvalidTask, dir)
		}
		var meta struct {
			Instruction  string `yaml:"instruction"`
			Descriptions []struct {
				Key         string `yaml:"key"`
				Description string `yaml:"description"`
			} `yaml:"descriptions"`
			Difficulty     string   `yaml:"difficulty"`
			Tags           []string `yaml:"tags"`
			Category       string   `yaml:"category"`
			MaxTestTimeout float64  `yaml:"max_test_timeout_sec"`
		}
		if err := yaml.NewDecoder(bytes.NewReader([]byte(y))).Decode(&meta); err != nil && !errors.Is(err, io.EOF) {
			return tt, fmt.Errorf("%w: %s/task.yaml: %v", ErrInvalidTask, dir, err)
		}
		t.Instruction = meta.Instruction
		for _, d := range meta.Descriptions {
			if t.Instruction == "" && (d.Key == "base" || len(meta.Descriptions) == 1) {
				t.Instruction = d.Description
			}
		}
		if strings.TrimSpace(t.Instruction) == "" {
			return tt, fmt.Errorf("%w: %s/task.yaml: no instruction", ErrInvalidTask, dir)
		}
		t.Difficulty = meta.Difficulty
		t.Tags = append(t.Tags, meta.Tags...)
		if meta.Category != "" {
			t.Tags = append(t.Tags, meta.Category)
		}
		if meta.MaxTestTimeout > 0 {
			t.CommandTimeout = time.Duration(meta.MaxTestTimeout * float64(time.Second))
		}
		if _, ok, _ := read("run-tests.sh"); !ok {
			return tt, fmt.Errorf("%w: %s: no run-tests.sh", ErrInvalidTask, dir)
		}
		tt.RunTests = filepath.Join(dir, "run-tests.sh")
		t.Env = map[string]string{"TEST_DIR": "/tests"}
		t.Verifier = "$(command -v bash || echo sh) /tests/run-tests.sh"
		t.RewardFrom = RewardExitStatus
		if sol, ok, err := read("solution.sh"); err != nil {
			return tt, err
		} else if ok {
			t.Solution = sol
		}
	}
	tt.Task = t
	return tt, nil
}

// WriteTerminalTask writes tt into the task directory out: NAME.yaml and
// its hidden files in NAME/ (the tests, and the runner). It refuses to
// replace an existing task.
func WriteTerminalTask(tt TerminalTask, out string) (string, error) {
	name := tt.Task.Name
	file := filepath.Join(out, name+".yaml")
	hidden := filepath.Join(out, name)
	for _, p := range []string{file, hidden} {
		if _, err := os.Lstat(p); err == nil {
			return "", fmt.Errorf("%s exists: remove it first", p)
		}
	}
	if err := os.CopyFS(hidden, os.DirFS(tt.Tests)); err != nil {
		return "", fmt.Errorf("copy the tests: %w", err)
	}
	if tt.RunTests != "" {
		b, err := os.ReadFile(tt.RunTests)
		if err == nil {
			err = os.WriteFile(filepath.Join(hidden, "run-tests.sh"), b, 0o755)
		}
		if err != nil {
			return "", fmt.Errorf("copy run-tests.sh: %w", err)
		}
	}
	t := tt.Task
	doc := map[string]any{
		"name": t.Name, "image": t.Image, "instruction": t.Instruction, "verifier": t.Verifier,
		"reward_from": t.RewardFrom, "hidden": name, "hidden_path": t.HiddenPath, "tags": t.Tags,
	}
	if t.Difficulty != "" {
		doc["difficulty"] = t.Difficulty
	}
	if len(t.Env) > 0 {
		doc["env"] = t.Env
	}
	if t.CommandTimeout > 0 {
		doc["command_timeout"] = t.CommandTimeout.Seconds()
	}
	if t.Solution != "" {
		doc["solution"] = t.Solution
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	head := "# Imported from a terminal-task directory by `arbor task import`\n" +
		"# (docs/tasks.md, \"Terminal-task directories\"); the tests are hidden\n" +
		"# files in " + name + "/, copied to /tests only in the trusted grader.\n"
	if err := os.WriteFile(file, append([]byte(head), b...), 0o644); err != nil {
		return "", err
	}
	if _, err := LoadTask(file); err != nil {
		os.Remove(file)
		os.RemoveAll(hidden)
		return "", fmt.Errorf("the imported task does not load: %w", err)
	}
	return file, nil
}
