package criu

import (
	"strings"
	"testing"
)

// TestAttrsRecordRoundTrip: the record written at a dump decodes to what
// was recorded (older images have none; a record with a bad id is
// refused), and attrDiffs names every attribute that differs, with both
// values, and nothing when they agree.
func TestAttrsRecordRoundTrip(t *testing.T) {
	filter, nice := uint32(0x33), 3
	rec := attrsRecord{Tasks: []taskAttrs{
		{TID: 1, PID: 1, Affinity: []int{0, 1}, IOPrio: 0, TimerSlack: 50000, CoredumpFilter: &filter, AutogroupNice: &nice},
		{TID: 7, PID: 5, Affinity: []int{0}, IOPrio: 3 << ioprioClassShift, TimerSlack: 77777,
			Fixed: map[string]string{"Speculation_Store_Bypass": "thread mitigated"}},
	}}
	b, err := encodeAttrs(rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeAttrs(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rec.Tasks {
		if d := attrDiffs(rec.Tasks[i], got.Tasks[i]); len(d) != 0 || len(got.Tasks) != len(rec.Tasks) {
			t.Errorf("task %d after a round trip: %v (%d tasks)", i, d, len(got.Tasks))
		}
	}
	if _, err := decodeAttrs([]byte(`{"tasks":[{"tid":0,"pid":1}]}`)); err == nil {
		t.Error("a record with task id 0 decoded")
	}

	base := rec.Tasks[0]
	other, filter2, nice2 := base, uint32(0x7), 0
	other.Affinity, other.IOPrio, other.TimerSlack = []int{0, 1, 2, 3, 6}, 2<<ioprioClassShift|7, 1
	other.CoredumpFilter, other.AutogroupNice = &filter2, &nice2
	other.Fixed = map[string]string{"SpeculationIndirectBranch": "always enabled"}
	want := base
	want.Fixed = map[string]string{"SpeculationIndirectBranch": "conditional force disabled"}
	for _, tt := range []struct {
		name       string
		want, got  taskAttrs
		diffs      int
		mentioning []string
	}{
		{"same", base, base, 0, nil},
		{"every attribute", want, other, 6, []string{
			"CPU affinity 0-1 (restored: 0-3,6)", "I/O priority none (level 0) (restored: best-effort level 7)",
			"timer slack 50000 ns (restored: 1 ns)", `SpeculationIndirectBranch "conditional force disabled" (restored: "always enabled"; no interface sets it from outside)`,
			"coredump_filter 0x33 (restored: 0x7)", "autogroup nice 3 (restored: 0)"}},
		{"the server's own affinity (none recorded) is not compared", taskAttrs{TID: 7, PID: 5}, taskAttrs{TID: 7, PID: 5, Affinity: []int{0, 1, 2}}, 0, nil},
		{"a thread has no process attributes", taskAttrs{TID: 7, PID: 5}, taskAttrs{TID: 7, PID: 5, CoredumpFilter: &filter}, 0, nil},
		{"idle", taskAttrs{IOPrio: 3 << ioprioClassShift}, taskAttrs{}, 1, []string{"I/O priority idle"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := attrDiffs(tt.want, tt.got)
			if len(d) != tt.diffs {
				t.Fatalf("diffs %q: want %d", d, tt.diffs)
			}
			all := strings.Join(d, "; ")
			for _, m := range tt.mentioning {
				if !strings.Contains(all, m) {
					t.Errorf("diffs %q do not say %q", all, m)
				}
			}
		})
	}
}

// TestParseProcAttrs: the /proc formats applyAttrs reads.
func TestParseProcAttrs(t *testing.T) {
	if n, err := parseAutogroup("/autogroup-143909 nice -3\n"); err != nil || n != -3 {
		t.Errorf("autogroup: %d %v", n, err)
	}
	if _, err := parseAutogroup("garbage"); err == nil {
		t.Error("autogroup garbage parsed")
	}
	m := fixedLines(nil, "Name:\tsh\nSpeculation_Store_Bypass:\tthread vulnerable\nSpeculationIndirectBranch:\tconditional enabled\nCpus_allowed:\t3\nuntag_mask:\t0xffffffffffffffff\n")
	m = fixedLines(m, "ksm_rmap_items 0\nksm_merge_any: yes\nksm_mergeable: no\n")
	if len(m) != 4 || m["Speculation_Store_Bypass"] != "thread vulnerable" || m["SpeculationIndirectBranch"] != "conditional enabled" ||
		m["untag_mask"] != "0xffffffffffffffff" || m["ksm_merge_any"] != "yes" {
		t.Errorf("fixed lines: %v", m)
	}
	if m := fixedLines(nil, "Name:\tsh\n"); m != nil {
		t.Errorf("fixed lines of a status without any: %v", m)
	}
	if got := cpuList([]int{0, 2, 3, 4, 9}); got != "0,2-4,9" {
		t.Errorf("cpu list: %q", got)
	}
}

// TestFixedDiffs: a field that differs is named; one the task no longer
// shows (no memory: a zombie, or a task exiting) is not a difference.
func TestFixedDiffs(t *testing.T) {
	want := taskAttrs{Fixed: map[string]string{"untag_mask": "0xffffffffffffffff", "ksm_merge_any": "no"}}
	tests := []struct {
		name string
		got  map[string]string
		n    int
	}{
		{name: "same", got: map[string]string{"untag_mask": "0xffffffffffffffff", "ksm_merge_any": "no"}, n: 0},
		{name: "one differs", got: map[string]string{"untag_mask": "0xffffffffffffffff", "ksm_merge_any": "yes"}, n: 1},
		{name: "empty value differs", got: map[string]string{"untag_mask": "", "ksm_merge_any": "no"}, n: 1},
		{name: "no memory any more", got: nil, n: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := fixedDiffs(want, taskAttrs{Fixed: tt.got}); len(d) != tt.n {
				t.Errorf("fixedDiffs = %q, want %d differences", d, tt.n)
			}
		})
	}
}
