package criu

// What the benchmarks of package criu_test time on their own.
var (
	RecordAttrs = func(dir string, root int) error {
		tasks, err := treeTasks(root)
		if err != nil {
			return err
		}
		return recordAttrs(dir, tasks)
	}
	ApplyAttrs = applyAttrs
	CheckFixed = checkFixed
)
