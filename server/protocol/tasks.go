package protocol

import "strconv"

// MethodTasks pages through the server's tasks, or a dataset's instances
// (docs/protocol.md, "tasks"); a v1 addition.
const MethodTasks = "tasks"

// MaxTasksLimit bounds a page of tasks.
const MaxTasksLimit = 1000

// TasksParams are the params of tasks: the dataset ("" for the tasks and
// the list of datasets), the cursor a previous page returned and the page
// size (default 100).
type TasksParams struct {
	Dataset string `msgpack:"dataset,omitempty"`
	Cursor  string `msgpack:"cursor,omitempty"`
	Limit   int    `msgpack:"limit,omitempty"`
}

func (p *TasksParams) check(c *checker) {
	if p.Limit < 0 || p.Limit > MaxTasksLimit {
		c.fail("limit", "want 0 (the default, 100) to %d, got %d", MaxTasksLimit, p.Limit)
	}
	if p.Cursor != "" {
		if n, err := strconv.Atoi(p.Cursor); err != nil || n < 0 {
			c.fail("cursor", "not a cursor a page returned: %q", p.Cursor)
		}
	}
}

// Validate returns nil or an invalid_params *Error naming every bad field.
func (p *TasksParams) Validate() error { return validate(p) }

// TaskSummary is one task of a page: an instance of a dataset that cannot
// be served has Error set (the server serves the others).
type TaskSummary struct {
	Name       string   `msgpack:"name" json:"name"`
	Image      string   `msgpack:"image,omitempty" json:"image,omitempty"`
	Difficulty string   `msgpack:"difficulty,omitempty" json:"difficulty,omitempty"`
	Tags       []string `msgpack:"tags,omitempty" json:"tags,omitempty"`
	MaxTurns   int      `msgpack:"max_turns,omitempty" json:"max_turns,omitempty"`
	Error      string   `msgpack:"error,omitempty" json:"error,omitempty"`
}

// DatasetSummary names a dataset and how many instances it has.
type DatasetSummary struct {
	Name      string `msgpack:"name" json:"name"`
	Instances int    `msgpack:"instances" json:"instances"`
}

// TasksResult is one page: next_cursor is "" on the last.
type TasksResult struct {
	Tasks      []TaskSummary    `msgpack:"tasks" json:"tasks"`
	Datasets   []DatasetSummary `msgpack:"datasets,omitempty" json:"datasets,omitempty"`
	NextCursor string           `msgpack:"next_cursor" json:"next_cursor"`
}
