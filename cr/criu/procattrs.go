package criu

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// attrsFile in an image directory holds what the dumped tasks had that
// CRIU's images have no field for (docs/inspector.md, "Kernel state
// coverage": the rows restored by "Arbor: recorded at dump, re-applied
// after restore"). Images without it (older ones) restore as before.
const attrsFile = "arbor-attrs.json"

// taskAttrs are one task's (one thread's) attributes that CRIU does not
// restore. Ids are the sandbox's own (its pid namespace): a restore brings
// back the same ones.
type taskAttrs struct {
	TID int `json:"tid"`
	PID int `json:"pid"` // its thread group
	// Affinity is the CPUs it may run on (sched_getaffinity); none
	// when it had the dumping server's own, the default every sandbox
	// starts with, which a restore gives it as the restoring server's
	// own (another node may have other CPUs).
	Affinity []int `json:"affinity,omitempty"`
	// IOPrio is ioprio_get(IOPRIO_WHO_PROCESS)'s raw value: class << 13
	// | level.
	IOPrio int `json:"ioprio"`
	// TimerSlack is /proc/TID/timerslack_ns.
	TimerSlack uint64 `json:"timerslack_ns"`
	// Fixed is what no interface sets from outside, so that a restore
	// only checks it: the task's speculation control, tagged-address
	// mask and x86 thread features as /proc/TID/status shows them, and
	// for the process (on its leader) ksm_stat's ksm_merge_any
	// (prctl PR_SET_MEMORY_MERGE).
	Fixed map[string]string `json:"fixed,omitempty"`
	// Of the whole process, on its leader (TID == PID) only:
	// CoredumpFilter is /proc/PID/coredump_filter, AutogroupNice the
	// nice of its autogroup (/proc/PID/autogroup).
	CoredumpFilter *uint32 `json:"coredump_filter,omitempty"`
	AutogroupNice  *int    `json:"autogroup_nice,omitempty"`
}

// Defaults every task starts with on Linux (prctl(2), proc(5)).
const (
	defaultTimerSlack     = 50000
	defaultCoredumpFilter = 0x33
)

// settable reports whether a holds anything a restore must set: an
// attribute other than the default every restored task starts with.
func (a taskAttrs) settable() bool {
	return len(a.Affinity) > 0 || a.IOPrio != 0 || a.TimerSlack != defaultTimerSlack ||
		a.CoredumpFilter != nil && *a.CoredumpFilter != defaultCoredumpFilter ||
		a.AutogroupNice != nil && *a.AutogroupNice != 0
}

// attrsRecord is attrsFile's content.
type attrsRecord struct {
	Tasks []taskAttrs `json:"tasks"`
}

func encodeAttrs(r attrsRecord) ([]byte, error) { return json.Marshal(r) }

func decodeAttrs(b []byte) (attrsRecord, error) {
	var r attrsRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode %s: %w", attrsFile, err)
	}
	for _, t := range r.Tasks {
		if t.TID <= 0 || t.PID <= 0 {
			return r, fmt.Errorf("decode %s: task %d of process %d: want positive ids", attrsFile, t.TID, t.PID)
		}
	}
	return r, nil
}

// attrDiffs names what of want got lacks, one entry per attribute that
// differs ("CPU affinity 0 (restored: 0-1)"); empty when they agree.
func attrDiffs(want, got taskAttrs) []string {
	return append(settableDiffs(want, got), fixedDiffs(want, got)...)
}

// settableDiffs is attrDiffs of the attributes Arbor sets.
func settableDiffs(want, got taskAttrs) []string {
	var d []string
	if want.Affinity != nil && !slices.Equal(want.Affinity, got.Affinity) {
		d = append(d, fmt.Sprintf("CPU affinity %s (restored: %s)", cpuList(want.Affinity), cpuList(got.Affinity)))
	}
	if want.IOPrio != got.IOPrio {
		d = append(d, fmt.Sprintf("I/O priority %s (restored: %s)", ioprioString(want.IOPrio), ioprioString(got.IOPrio)))
	}
	if want.TimerSlack != got.TimerSlack {
		d = append(d, fmt.Sprintf("timer slack %d ns (restored: %d ns)", want.TimerSlack, got.TimerSlack))
	}
	if want.CoredumpFilter != nil && (got.CoredumpFilter == nil || *got.CoredumpFilter != *want.CoredumpFilter) {
		d = append(d, fmt.Sprintf("coredump_filter %#x (restored: %s)", *want.CoredumpFilter, optString(got.CoredumpFilter, "%#x")))
	}
	if want.AutogroupNice != nil && (got.AutogroupNice == nil || *got.AutogroupNice != *want.AutogroupNice) {
		d = append(d, fmt.Sprintf("autogroup nice %d (restored: %s)", *want.AutogroupNice, optString(got.AutogroupNice, "%d")))
	}
	return d
}

// fixedDiffs is attrDiffs of the fields nothing sets from outside.
func fixedDiffs(want, got taskAttrs) []string {
	var d []string
	for _, k := range sortedKeys(want.Fixed) {
		g, ok := got.Fixed[k]
		if !ok {
			// The task shows no such field now: it has no memory (a
			// zombie, or one exiting: checkFixed runs once the tree
			// runs), so nothing of it can differ (make test: a
			// restored bash subshell on its way out failed a branch).
			continue
		}
		if v := want.Fixed[k]; g != v {
			d = append(d, fmt.Sprintf("%s %q (restored: %q; no interface sets it from outside)", k, v, got.Fixed[k]))
		}
	}
	return d
}

func optString[T any](p *T, format string) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf(format, *p)
}

func sortedKeys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

// cpuList writes CPUs as the kernel's lists do: "0-3,6".
func cpuList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ioprio's encoding (linux/ioprio.h).
const (
	ioprioClassShift = 13
	ioprioWhoProcess = 1
)

// ioprioString is ionice's wording of an ioprio value.
func ioprioString(v int) string {
	class, level := v>>ioprioClassShift, v&(1<<ioprioClassShift-1)
	switch class {
	case 0:
		return fmt.Sprintf("none (level %d)", level)
	case 1:
		return fmt.Sprintf("realtime level %d", level)
	case 2:
		return fmt.Sprintf("best-effort level %d", level)
	case 3:
		return "idle"
	}
	return fmt.Sprintf("class %d level %d", class, level)
}

// parseAutogroup reads the nice of /proc/PID/autogroup: "/autogroup-25 nice 0".
func parseAutogroup(s string) (int, error) {
	f := strings.Fields(s)
	if len(f) != 3 || f[1] != "nice" {
		return 0, fmt.Errorf("autogroup %q: want \"/autogroup-N nice N\"", strings.TrimSpace(s))
	}
	return strconv.Atoi(f[2])
}

// fixedPrefixes are the status lines (and ksm_stat's) of fields no
// interface sets from outside the task.
var fixedPrefixes = []string{"Speculation", "untag_mask", "x86_Thread_features", "ksm_merge_any"}

// fixedLines adds to m the lines of a status (or ksm_stat) file that
// fixedPrefixes name, and returns m (nil when it stays empty).
func fixedLines(m map[string]string, file string) map[string]string {
	for _, line := range strings.Split(file, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !slices.ContainsFunc(fixedPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[k] = strings.TrimSpace(v)
	}
	return m
}
