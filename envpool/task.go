package envpool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/arbor-env/arbor/sandbox"
)

// Task is one kind of episode: an image, the commands that prepare it, the
// instruction the agent gets as its first observation, and a verifier whose
// result is the reward.
type Task struct {
	// Name identifies the task in reset requests; it defaults to the file
	// name without its extension.
	Name  string `json:"name" yaml:"name"`
	Image string `json:"image" yaml:"image"`
	// Setup runs once per task, in order, in the environment's persistent
	// shell (so cd and export carry over), before the post-setup
	// checkpoint that every reset starts from.
	Setup       []string `json:"setup,omitempty" yaml:"setup,omitempty"`
	Instruction string   `json:"instruction" yaml:"instruction"`
	// Verifier is a /bin/sh script run on a throwaway fork of the
	// environment, not in the agent's shell: as a fresh child of the
	// sandbox's init, with the task's Env (plus PATH, HOME and ARBOR_SEED
	// when the episode has one), in the directory setup ended in, after
	// every process the agent left running has been killed. If the last
	// line it prints on stdout is a number, that number is the reward;
	// otherwise exit status 0 is 1.0 and anything else 0.0.
	Verifier string `json:"verifier,omitempty" yaml:"verifier,omitempty"`
	// VerifierKeepsProcesses leaves the agent's processes running while
	// the verifier runs, for a verifier that talks to a service the agent
	// started. They can then interfere with the verifier (see
	// docs/sandbox.md, "Control channel and grader integrity").
	VerifierKeepsProcesses bool `json:"verifier_keeps_processes,omitempty" yaml:"verifier_keeps_processes,omitempty"`
	// MaxTurns ends an episode with truncated=true once reached (0: no
	// limit).
	MaxTurns int `json:"max_turns,omitempty" yaml:"max_turns,omitempty"`
	// CommandTimeout bounds each agent command and the verifier (0: the
	// server's default). In files: seconds (30, 2.5) or a Go duration
	// string ("90s", "2m").
	CommandTimeout time.Duration `json:"command_timeout,omitempty" yaml:"command_timeout,omitempty"`
	// Env is exported in the shell before setup, so setup, the agent and
	// the verifier all see it.
	Env map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// Caps, when set, is the capability set the task's sandboxes keep
	// (names like CAP_CHOWN); empty means Docker's default set. Fewer is
	// always allowed; more only on a server run with --allow-extra-caps.
	Caps []string `json:"caps,omitempty" yaml:"caps,omitempty"`

	// Outputs are the paths (absolute, in the sandbox) that hold the
	// agent's work: the trusted grader copies them, and nothing else of
	// the agent's files, into a pristine copy of the post-setup state
	// before the verifier runs there (docs/tasks.md, "The trusted
	// grader"). Empty: the directory setup ended in.
	Outputs []string `json:"outputs,omitempty" yaml:"outputs,omitempty"`
	// Hidden is a directory on the server's host (in a task file:
	// relative to the file) whose contents the grader copies to
	// HiddenPath after the agent's work, and HiddenFiles are files given
	// inline (a path relative to HiddenPath: its contents). Neither is
	// ever in the agent's sandbox, its checkpoints or its branches.
	Hidden      string            `json:"-" yaml:"-"`
	HiddenFiles map[string]string `json:"-" yaml:"-"`
	// HiddenPath is where the hidden files appear for the verifier
	// (default DefaultHiddenPath).
	HiddenPath string `json:"hidden_path,omitempty" yaml:"hidden_path,omitempty"`
	// RewardRange bounds the reward (default [0, 1]); a verifier whose
	// reward falls outside is a verifier_error, never a reward.
	RewardRange [2]float64 `json:"reward_range,omitzero" yaml:"reward_range,omitempty"`
	// RewardFrom says how the verifier's result becomes the reward
	// (docs/tasks.md, "Reward"): RewardAuto (default), RewardExitStatus,
	// RewardStdout or RewardRubric (the default when Rubric is set).
	RewardFrom string `json:"reward_from,omitempty" yaml:"reward_from,omitempty"`
	// Rubric weighs the named components that the verifier prints as a
	// JSON object on its last stdout line; the reward is their weighted
	// sum.
	Rubric map[string]float64 `json:"rubric,omitempty" yaml:"rubric,omitempty"`
	// MaxOutputBytes bounds what the grader copies of Outputs (default
	// DefaultMaxOutputBytes); an agent whose outputs are larger scores
	// the range's low end.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty" yaml:"max_output_bytes,omitempty"`
	// Solution is a reference solution (a shell script run in the
	// agent's shell, as the agent would): never shown to an agent; tests
	// and the cheater suite check that it scores the range's high end.
	Solution string `json:"-" yaml:"-"`
	// Tags, Difficulty and Metadata describe the task to trainers; the
	// server does not read them.
	Tags       []string       `json:"tags,omitempty" yaml:"tags,omitempty"`
	Difficulty string         `json:"difficulty,omitempty" yaml:"difficulty,omitempty"`
	Metadata   map[string]any `json:"metadata,omitempty" yaml:"metadata,omitempty"`
}

// How a verifier's result becomes a reward (Task.RewardFrom).
const (
	// RewardAuto: the number on the last stdout line if it is one, else
	// the exit status (0: the range's high end, else its low end).
	RewardAuto = "auto"
	// RewardExitStatus: the exit status alone.
	RewardExitStatus = "exit_status"
	// RewardStdout: the last stdout line must be a number.
	RewardStdout = "stdout"
	// RewardRubric: the last stdout line must be a JSON object with a
	// number for each of the rubric's components.
	RewardRubric = "rubric"
)

const (
	// DefaultHiddenPath is where the hidden files appear to the verifier.
	DefaultHiddenPath = "/grader"
	// DefaultMaxOutputBytes bounds the agent's outputs the grader copies.
	DefaultMaxOutputBytes = 256 << 20
)

// Range is the task's reward range, [0, 1] unless set.
func (t Task) Range() (lo, hi float64) {
	if t.RewardRange == [2]float64{} {
		return 0, 1
	}
	return t.RewardRange[0], t.RewardRange[1]
}

// rewardFrom is RewardFrom with its default.
func (t Task) rewardFrom() string {
	switch {
	case t.RewardFrom != "":
		return t.RewardFrom
	case len(t.Rubric) > 0:
		return RewardRubric
	}
	return RewardAuto
}

// hiddenPath is HiddenPath with its default.
func (t Task) hiddenPath() string {
	if t.HiddenPath == "" {
		return DefaultHiddenPath
	}
	return t.HiddenPath
}

// trusted says whether the verifier runs in the trusted grader (a
// pristine copy with the agent's outputs) rather than on a fork of the
// agent's sandbox with its processes (VerifierKeepsProcesses).
func (t Task) trusted() bool { return !t.VerifierKeepsProcesses }

// taskFile is Task as it is spelled in files (the timeout as seconds or a
// duration string).
type taskFile struct {
	Name           string             `json:"name" yaml:"name"`
	Image          string             `json:"image" yaml:"image"`
	Setup          []string           `json:"setup" yaml:"setup"`
	Instruction    string             `json:"instruction" yaml:"instruction"`
	Verifier       string             `json:"verifier" yaml:"verifier"`
	MaxTurns       int                `json:"max_turns" yaml:"max_turns"`
	CommandTimeout flexDuration       `json:"command_timeout" yaml:"command_timeout"`
	Env            map[string]string  `json:"env" yaml:"env"`
	Caps           []string           `json:"caps" yaml:"caps"`
	KeepProcesses  bool               `json:"verifier_keeps_processes" yaml:"verifier_keeps_processes"`
	Outputs        []string           `json:"outputs" yaml:"outputs"`
	Hidden         string             `json:"hidden" yaml:"hidden"`
	HiddenFiles    map[string]string  `json:"hidden_files" yaml:"hidden_files"`
	HiddenPath     string             `json:"hidden_path" yaml:"hidden_path"`
	RewardRange    []float64          `json:"reward_range" yaml:"reward_range"`
	RewardFrom     string             `json:"reward_from" yaml:"reward_from"`
	Rubric         map[string]float64 `json:"rubric" yaml:"rubric"`
	MaxOutputBytes int64              `json:"max_output_bytes" yaml:"max_output_bytes"`
	Solution       string             `json:"solution" yaml:"solution"`
	// ID is a dataset instance's name, when its line says id, not name.
	ID         string         `json:"id" yaml:"-"`
	Tags       []string       `json:"tags" yaml:"tags"`
	Difficulty string         `json:"difficulty" yaml:"difficulty"`
	Metadata   map[string]any `json:"metadata" yaml:"metadata"`
}

func (f taskFile) task() (Task, error) {
	t := Task{Name: f.Name, Image: f.Image, Setup: f.Setup, Instruction: f.Instruction, Verifier: f.Verifier,
		MaxTurns: f.MaxTurns, CommandTimeout: time.Duration(f.CommandTimeout), Env: f.Env, Caps: f.Caps,
		VerifierKeepsProcesses: f.KeepProcesses, Outputs: f.Outputs, Hidden: f.Hidden, HiddenFiles: f.HiddenFiles,
		HiddenPath: f.HiddenPath, Solution: f.Solution, RewardFrom: f.RewardFrom, Rubric: f.Rubric, MaxOutputBytes: f.MaxOutputBytes,
		Tags: f.Tags, Difficulty: f.Difficulty, Metadata: f.Metadata}
	switch len(f.RewardRange) {
	case 0:
	case 2:
		t.RewardRange = [2]float64{f.RewardRange[0], f.RewardRange[1]}
	default:
		return t, fmt.Errorf("reward_range: want [low, high], got %d numbers", len(f.RewardRange))
	}
	return t, nil
}

// MarshalJSON writes the timeout as seconds, as files spell it.
func (t Task) MarshalJSON() ([]byte, error) {
	type plain Task
	return json.Marshal(struct {
		plain
		CommandTimeout float64 `json:"command_timeout,omitempty"`
	}{plain(t), t.CommandTimeout.Seconds()})
}

// UnmarshalJSON reads the file spelling (timeout as seconds or a duration
// string); it does not validate.
func (t *Task) UnmarshalJSON(b []byte) error {
	var f taskFile
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	v, err := f.task()
	*t = v
	return err
}

// flexDuration is a duration written as a number of seconds or as a Go
// duration string.
type flexDuration time.Duration

func parseFlexDuration(s string) (flexDuration, error) {
	s = strings.TrimSpace(s)
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(secs) || math.IsInf(secs, 0) || secs < 0 || secs > 1e9 {
			return 0, fmt.Errorf("duration %q out of range", s)
		}
		return flexDuration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want seconds (30, 2.5) or a duration like \"90s\"", s)
	}
	return flexDuration(d), nil
}

func (d *flexDuration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		s = string(b) // a number
	}
	v, err := parseFlexDuration(s)
	*d = v
	return err
}

func (d *flexDuration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: duration must be a number of seconds or a string", n.Line)
	}
	v, err := parseFlexDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = v
	return nil
}

var (
	taskNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// instanceTaskRE is a dataset instance's task name, DATASET/NAME.
	instanceTaskRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	envNameRE      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate reports everything wrong with t at once.
func (t Task) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !taskNameRE.MatchString(t.Name) && !instanceTaskRE.MatchString(t.Name) {
		bad("name %q: want 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", t.Name)
	}
	if strings.TrimSpace(t.Image) == "" {
		bad("image: required (e.g. busybox or debian)")
	}
	for i, c := range t.Setup {
		if strings.TrimSpace(c) == "" {
			bad("setup[%d]: empty command", i)
		}
	}
	if t.MaxTurns < 0 {
		bad("max_turns %d: must be 0 (no limit) or more", t.MaxTurns)
	}
	if t.CommandTimeout < 0 {
		bad("command_timeout %s: must not be negative", t.CommandTimeout)
	}
	keys := make([]string, 0, len(t.Env))
	for k := range t.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !envNameRE.MatchString(k) {
			bad("env %q: not a shell variable name", k)
		}
		if strings.ContainsRune(t.Env[k], 0) {
			bad("env %s: value contains a NUL byte", k)
		}
	}
	t.validateGrading(bad)
	// Names only: whether the server grants more than the default set is
	// decided when a sandbox starts (sandbox.Isolation.KeptCaps).
	if _, err := sandbox.ParseCaps(t.Caps); err != nil {
		bad("caps: %v", err)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: task %q: %w", ErrInvalidTask, t.Name, errors.Join(errs...))
}

// LoadTask reads and validates a task file: YAML (.yaml, .yml) or JSON
// (.json). Unknown fields are errors, so a misspelt key is not ignored.
func LoadTask(path string) (Task, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Task{}, fmt.Errorf("read task: %w", err)
	}
	var f taskFile
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".yaml", ".yml":
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		err = dec.Decode(&f)
	case ".json":
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err = dec.Decode(&f)
	default:
		return Task{}, fmt.Errorf("%w: %s: extension %q, want .yaml, .yml or .json", ErrInvalidTask, path, ext)
	}
	if err != nil {
		return Task{}, fmt.Errorf("%w: %s: %v", ErrInvalidTask, path, err)
	}
	t, err := f.task()
	if err != nil {
		return Task{}, fmt.Errorf("%w: %s: %v", ErrInvalidTask, path, err)
	}
	if t.Name == "" {
		t.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	if strings.Contains(t.Name, "/") {
		return Task{}, fmt.Errorf("%w: %s: name %q: a '/' names a dataset's instance", ErrInvalidTask, path, t.Name)
	}
	if t.Hidden != "" && !filepath.IsAbs(t.Hidden) {
		t.Hidden = filepath.Join(filepath.Dir(path), t.Hidden)
	}
	if err := t.Validate(); err != nil {
		return Task{}, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// LoadTasks loads every task file (.yaml, .yml, .json) in dir, in name
// order. All bad files are reported together; two tasks with one name are
// an error.
func LoadTasks(dir string) ([]Task, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read task dir: %w", err)
	}
	var (
		tasks []Task
		errs  []error
		seen  = map[string]string{}
	)
	for _, ent := range ents {
		ext := strings.ToLower(filepath.Ext(ent.Name()))
		if ent.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		path := filepath.Join(dir, ent.Name())
		t, err := LoadTask(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, ok := seen[t.Name]; ok {
			errs = append(errs, fmt.Errorf("%w: task name %q used by both %s and %s", ErrInvalidTask, t.Name, prev, path))
			continue
		}
		seen[t.Name] = path
		tasks = append(tasks, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return tasks, nil
}

// UnmarshalYAML reads the file spelling (timeout as seconds or a duration
// string); it does not validate.
func (t *Task) UnmarshalYAML(n *yaml.Node) error {
	var f taskFile
	if err := n.Decode(&f); err != nil {
		return err
	}
	v, err := f.task()
	*t = v
	return err
}
