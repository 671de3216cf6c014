package initd

import "strings"

// defaultPath is the PATH of the shell and of OpRun children that are
// given none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// shellEnv is the persistent shell's environment: the default one (what
// every shell had before images brought their own, SHELL being path), with
// the config's KEY=VALUE pairs added, a key given there replacing the
// default's. When the config gives a key twice, the last one counts, as in
// a Dockerfile. Entries are validated by the server and init alike
// (ctl.Shell.Validate); one without '=' is dropped.
func shellEnv(path string, extra []string) []string {
	env := []string{
		"PATH=" + defaultPath,
		"HOME=/root", "TERM=dumb", "LANG=C.UTF-8", "PS1=", "PS2=", "SHELL=" + path,
	}
	if len(extra) == 0 {
		return env
	}
	last := make(map[string]int, len(extra)) // key: index of its last entry in extra
	for i, kv := range extra {
		if k, _, ok := strings.Cut(kv, "="); ok {
			last[k] = i
		}
	}
	out := make([]string, 0, len(env)+len(extra))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := last[k]; !ok {
			out = append(out, kv)
		}
	}
	for i, kv := range extra {
		if k, _, ok := strings.Cut(kv, "="); ok && last[k] == i {
			out = append(out, kv)
		}
	}
	return out
}
