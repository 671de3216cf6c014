package coordinator

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/state"
)

// TaskInfo is what the coordinator knows of an env's task.
type TaskInfo struct {
	Name, Image string
	// MaxTurns sets truncated once an episode reaches it (0: no limit).
	MaxTurns int
	// CommandTimeout is the default timeout of a bash step (0: the
	// coordinator's default).
	CommandTimeout time.Duration
}

// ResetRequest asks for a new episode: of a task, or of a bare image.
type ResetRequest struct {
	Task, Image string
	// Dataset picks the task among a dataset's instances: the one at
	// Index, else the one Seed picks.
	Dataset string
	Index   *int
	Seed    int64
	// MaxTurns, when set, replaces the task's limit for this episode (0:
	// none); its branch children inherit it.
	MaxTurns *int
	// Ephemeral: the env belongs to something that ends with this process
	// (an MCP session); it is not adopted again after a crash.
	Ephemeral bool
}

// Reset is a new episode's env, as the task pool made it.
type Reset struct {
	Env         *branch.Env
	StateID     string
	Task        TaskInfo
	Instruction string
}

// Evaluation is a verifier's verdict.
type Evaluation struct {
	Reward  float64
	Details map[string]any
}

// Tasks is what the coordinator needs of a task pool: it makes new
// episodes' envs, runs verifiers and knows which task a state descends
// from. The envs it keeps in reserve (templates, warm copies) are never
// handed to the coordinator, so no client sees them. Errors wrap the
// coordinator's sentinels or the engine's.
type Tasks interface {
	Reset(ctx context.Context, req ResetRequest) (*Reset, error)
	// Evaluate runs task's verifier on a fork of env; seed is the
	// episode's (0: none).
	Evaluate(ctx context.Context, env *branch.Env, task TaskInfo, seed int64) (Evaluation, error)
	// TaskOfState names the task whose prepared state sid descends from.
	TaskOfState(sid string) (TaskInfo, bool)
	// TaskNames lists the tasks reset accepts.
	TaskNames() []string
	// List pages through the tasks (dataset ""), or a dataset's
	// instances from cursor.
	List(dataset, cursor string, limit int) (TaskPage, error)
}

// TaskSummary describes a task to a client; Error says why an instance
// of a dataset cannot be served.
type TaskSummary struct {
	Name, Image, Difficulty string
	Tags                    []string
	MaxTurns                int
	Error                   string
}

// DatasetSummary names a dataset and the number of its instances.
type DatasetSummary struct {
	Name      string
	Instances int
}

// TaskPage is one page of List: the tasks, the datasets (on the first
// page of the tasks) and the cursor of the next page ("" at the end).
type TaskPage struct {
	Tasks    []TaskSummary
	Datasets []DatasetSummary
	Next     string
}

// MaxTaskPage bounds a page of List.
const MaxTaskPage = 1000

// Images is the Tasks of a server without tasks: reset starts a fresh env
// from an image and nothing has a verifier.
type Images struct{ E *branch.Engine }

var _ Tasks = Images{}

// Reset implements Tasks.
func (p Images) Reset(ctx context.Context, req ResetRequest) (*Reset, error) {
	if req.Task != "" {
		return nil, fmt.Errorf("%w: %q (this server has no tasks)", state.ErrUnknownTask, req.Task)
	}
	if req.Image == "" {
		return nil, fmt.Errorf("%w: reset needs an image or a task", state.ErrInvalid)
	}
	env, sid, err := p.E.NewEnv(ctx, req.Image)
	if err != nil {
		return nil, fmt.Errorf("reset image %s: %w", req.Image, err)
	}
	return &Reset{Env: env, StateID: sid, Task: TaskInfo{Image: req.Image}}, nil
}

// Evaluate implements Tasks: without tasks there is no verifier.
func (Images) Evaluate(_ context.Context, env *branch.Env, _ TaskInfo, _ int64) (Evaluation, error) {
	return Evaluation{}, fmt.Errorf("%w: env %s runs image %s without a task", state.ErrNoVerifier, env.ID, env.Image)
}

// TaskOfState implements Tasks.
func (Images) TaskOfState(string) (TaskInfo, bool) { return TaskInfo{}, false }

// TaskNames implements Tasks.
func (Images) TaskNames() []string { return nil }

// List implements Tasks: there are none.
func (Images) List(dataset, _ string, _ int) (TaskPage, error) {
	if dataset != "" {
		return TaskPage{}, fmt.Errorf("%w: no dataset %q (this server has no tasks)", state.ErrUnknownTask, dataset)
	}
	return TaskPage{}, nil
}

// FromEnvpool adapts an envpool.Pool (tasks, warm pool, verifiers) to
// Tasks.
func FromEnvpool(p *envpool.Pool) Tasks { return envpoolTasks{p} }

type envpoolTasks struct{ p *envpool.Pool }

func taskInfo(t envpool.Task) TaskInfo {
	return TaskInfo{Name: t.Name, Image: t.Image, MaxTurns: t.MaxTurns, CommandTimeout: t.CommandTimeout}
}

func (a envpoolTasks) Reset(ctx context.Context, req ResetRequest) (*Reset, error) {
	r, err := a.p.Reset(ctx, envpool.ResetRequest{Task: req.Task, Image: req.Image, Seed: req.Seed, Dataset: req.Dataset, Index: req.Index})
	if err != nil {
		return nil, err
	}
	return &Reset{Env: r.Env, StateID: r.StateID, Task: taskInfo(r.Task), Instruction: r.Instruction}, nil
}

func (a envpoolTasks) Evaluate(ctx context.Context, env *branch.Env, task TaskInfo, seed int64) (Evaluation, error) {
	t, ok := a.p.Task(task.Name)
	if !ok {
		t = envpool.Task{Image: env.Image}
	}
	ev, err := a.p.Evaluate(ctx, env, t, seed)
	return Evaluation{Reward: ev.Reward, Details: ev.Details}, err
}

func (a envpoolTasks) TaskOfState(sid string) (TaskInfo, bool) {
	t, ok := a.p.TaskOfState(sid)
	return taskInfo(t), ok
}

func (a envpoolTasks) TaskNames() []string {
	var names []string
	for _, t := range a.p.Tasks() {
		names = append(names, t.Name)
	}
	return names
}

func summary(t envpool.Task) TaskSummary {
	return TaskSummary{Name: t.Name, Image: t.Image, Difficulty: t.Difficulty, Tags: t.Tags, MaxTurns: t.MaxTurns}
}

func (a envpoolTasks) List(dataset, cursor string, limit int) (TaskPage, error) {
	if limit <= 0 || limit > MaxTaskPage {
		limit = min(MaxTaskPage, max(limit, 100))
	}
	from := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 {
			return TaskPage{}, fmt.Errorf("%w: cursor %q is not one a page returned", state.ErrInvalid, cursor)
		}
		from = n
	}
	var page TaskPage
	if dataset == "" {
		tasks := a.p.Tasks()
		for _, t := range tasks[min(from, len(tasks)):min(from+limit, len(tasks))] {
			page.Tasks = append(page.Tasks, summary(t))
		}
		if from+limit < len(tasks) {
			page.Next = strconv.Itoa(from + limit)
		}
		if from == 0 {
			for _, d := range a.p.Datasets() {
				page.Datasets = append(page.Datasets, DatasetSummary{Name: d.Name, Instances: d.Len()})
			}
		}
		return page, nil
	}
	var d *envpool.Dataset
	for _, x := range a.p.Datasets() {
		if x.Name == dataset {
			d = x
		}
	}
	if d == nil {
		return TaskPage{}, fmt.Errorf("%w: no dataset %q", state.ErrUnknownTask, dataset)
	}
	to := min(from+limit, d.Len())
	for i := from; i < to; i++ {
		t, err := d.Instance(i)
		if err != nil {
			page.Tasks = append(page.Tasks, TaskSummary{Name: dataset + "/" + d.Names(i, 1)[0], Error: err.Error()})
			continue
		}
		page.Tasks = append(page.Tasks, summary(t))
	}
	if to < d.Len() {
		page.Next = strconv.Itoa(to)
	}
	return page, nil
}
