package sandbox

// DescribeTasks exposes the task list KillAllButInit puts in its timeout
// error.
func DescribeTasks(s *Sandbox) string { return s.describeTasks() }
