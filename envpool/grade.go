package envpool

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/arbor-env/arbor/state"
)

// MaxOutputs bounds the paths a task may name as the agent's outputs.
const MaxOutputs = 64

// maxHiddenInline bounds the inline hidden files of one task (a dataset
// of thousands holds them all in memory).
const maxHiddenInline = 16 << 20

var componentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`)

// validateGrading reports what is wrong with the task's grading fields
// (outputs, hidden files, reward rules) through bad.
func (t Task) validateGrading(bad func(string, ...any)) {
	if len(t.Outputs) > MaxOutputs {
		bad("outputs: %d paths, at most %d", len(t.Outputs), MaxOutputs)
	}
	for i, o := range t.Outputs {
		if err := checkSandboxPath(o); err != nil {
			bad("outputs[%d] %q: %v", i, o, err)
		}
		for _, o2 := range t.Outputs[:i] {
			if within(o, o2) || within(o2, o) {
				bad("outputs %q and %q overlap", o2, o)
			}
		}
	}
	hidden := t.Hidden != "" || len(t.HiddenFiles) > 0
	if t.HiddenPath != "" {
		if err := checkSandboxPath(t.HiddenPath); err != nil {
			bad("hidden_path %q: %v", t.HiddenPath, err)
		}
	}
	if hidden {
		for _, o := range t.Outputs {
			if within(t.hiddenPath(), o) || within(o, t.hiddenPath()) {
				bad("hidden_path %s and output %s overlap: the agent's files would mix with the hidden ones", t.hiddenPath(), o)
			}
		}
		if t.VerifierKeepsProcesses {
			bad("hidden files need the trusted grader, which runs without the agent's processes: drop verifier_keeps_processes or the hidden files")
		}
	}
	size := 0
	names := make([]string, 0, len(t.HiddenFiles))
	for n := range t.HiddenFiles {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		size += len(t.HiddenFiles[n])
		if c := path.Clean(n); n == "" || c != n || path.IsAbs(n) || c == "." || c == ".." || strings.HasPrefix(c, "../") {
			bad("hidden_files %q: want a clean relative path (no '..', not absolute)", n)
		}
	}
	if size > maxHiddenInline {
		bad("hidden_files: %d bytes, at most %d inline (put larger ones in a hidden directory)", size, maxHiddenInline)
	}
	lo, hi := t.Range()
	if math.IsNaN(lo) || math.IsNaN(hi) || math.IsInf(lo, 0) || math.IsInf(hi, 0) || lo >= hi {
		bad("reward_range [%v, %v]: want finite numbers, low below high", lo, hi)
	}
	switch t.RewardFrom {
	case "", RewardAuto, RewardExitStatus, RewardStdout, RewardRubric:
	default:
		bad("reward_from %q: want %s, %s, %s or %s", t.RewardFrom, RewardAuto, RewardExitStatus, RewardStdout, RewardRubric)
	}
	if t.rewardFrom() == RewardRubric && len(t.Rubric) == 0 {
		bad("reward_from rubric: the task has no rubric")
	}
	if len(t.Rubric) > 0 && t.rewardFrom() != RewardRubric {
		bad("rubric given but reward_from is %s", t.rewardFrom())
	}
	parts := make([]string, 0, len(t.Rubric))
	for k := range t.Rubric {
		parts = append(parts, k)
	}
	slices.Sort(parts)
	for _, k := range parts {
		w := t.Rubric[k]
		if !componentRE.MatchString(k) {
			bad("rubric component %q: want a name of letters, digits, '_', '.' or '-'", k)
		}
		if math.IsNaN(w) || math.IsInf(w, 0) {
			bad("rubric component %s: weight %v is not finite", k, w)
		}
	}
	if t.MaxOutputBytes < 0 {
		bad("max_output_bytes %d: must not be negative", t.MaxOutputBytes)
	}
}

// checkSandboxPath accepts an absolute, clean path in a sandbox that is
// neither its root nor in its kernel filesystems.
func checkSandboxPath(p string) error {
	switch {
	case !path.IsAbs(p) || path.Clean(p) != p:
		return errors.New("want an absolute, clean path")
	case p == "/":
		return errors.New("not the whole root")
	}
	for _, k := range []string{"/proc", "/sys", "/dev"} {
		if within(p, k) {
			return fmt.Errorf("not in %s", k)
		}
	}
	return nil
}

// within says whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// Score is a verifier's result read as a reward.
type Score struct {
	Reward float64
	// From says which rule gave it: "stdout", "exit_status", "rubric" or
	// "timeout".
	From string
	// Parts are the rubric's components as the verifier printed them.
	Parts map[string]float64
}

// Score turns a verifier's stdout, exit status and timeout into the
// task's reward (docs/tasks.md, "Reward"). A result that is no reward
// under the task's rules is an error wrapping state.ErrVerifierOutput.
func (t Task) Score(stdout string, exitCode int, timedOut bool) (Score, error) {
	lo, hi := t.Range()
	if timedOut {
		return Score{Reward: lo, From: "timeout"}, nil
	}
	lines := strings.Split(strings.TrimRight(stdout, " \t\r\n"), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	inRange := func(s Score) (Score, error) {
		if s.Reward < lo || s.Reward > hi {
			return Score{}, fmt.Errorf("%w: reward %v outside the task's range [%v, %v]", state.ErrVerifierOutput, s.Reward, lo, hi)
		}
		return s, nil
	}
	byStatus := func() Score {
		if exitCode == 0 {
			return Score{Reward: hi, From: "exit_status"}
		}
		return Score{Reward: lo, From: "exit_status"}
	}
	switch t.rewardFrom() {
	case RewardExitStatus:
		return byStatus(), nil
	case RewardStdout:
		v, err := parseReward(last)
		if err != nil {
			return Score{}, fmt.Errorf("%w: the last line of stdout is %q, not a number", state.ErrVerifierOutput, clip(last, 80))
		}
		return inRange(Score{Reward: v, From: "stdout"})
	case RewardRubric:
		parts, err := t.rubricParts(last)
		if err != nil {
			return Score{}, err
		}
		sum := 0.0
		for _, k := range slices.Sorted(maps.Keys(t.Rubric)) {
			sum += t.Rubric[k] * parts[k]
		}
		// The weighted sum rounds: weights 0.25+0.2+0.3+0.1+0.15 of full
		// parts add up to 1.0000000000000002. Within a rounding error of
		// the range is the range's end, not a verifier error.
		if tol := 1e-9 * max(1, math.Abs(lo), math.Abs(hi)); sum > hi && sum-hi <= tol {
			sum = hi
		} else if sum < lo && lo-sum <= tol {
			sum = lo
		}
		return inRange(Score{Reward: sum, From: "rubric", Parts: parts})
	}
	if v, err := parseReward(last); err == nil {
		return inRange(Score{Reward: v, From: "stdout"})
	} else if last != "" && looksNumeric(last) {
		return Score{}, fmt.Errorf("%w: the last line of stdout %q is %v", state.ErrVerifierOutput, clip(last, 80), err)
	}
	return byStatus(), nil
}

// rubricParts reads the rubric's components from line, a JSON object
// with a finite number for each and no other key.
func (t Task) rubricParts(line string) (map[string]float64, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("%w: the last line of stdout %q is not a JSON object of the rubric's components", state.ErrVerifierOutput, clip(line, 80))
	}
	parts := make(map[string]float64, len(raw))
	var errs []string
	for k := range t.Rubric {
		v, ok := raw[k]
		if !ok {
			errs = append(errs, k+": missing")
			continue
		}
		f, err := parseReward(string(v))
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %s is not a finite number", k, clip(string(v), 40)))
			continue
		}
		parts[k] = f
	}
	for k := range raw {
		if _, ok := t.Rubric[k]; !ok {
			errs = append(errs, k+": not in the rubric")
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return nil, fmt.Errorf("%w: rubric components: %s", state.ErrVerifierOutput, strings.Join(errs, "; "))
	}
	return parts, nil
}

// parseReward reads a finite number.
func parseReward(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("not finite")
	}
	return v, nil
}

// looksNumeric says whether s is spelled like a number (so that a NaN, an
// infinity or an overflow is a verifier error, not a line of prose).
func looksNumeric(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil || errors.Is(err, strconv.ErrRange)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
