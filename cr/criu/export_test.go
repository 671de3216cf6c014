package criu

// What the benchmarks of package criu_test time on their own.
var (
	PosixQueues = posixQueues
	RecordAttrs = recordAttrs
	ApplyAttrs  = applyAttrs
	CheckFixed  = checkFixed
)
