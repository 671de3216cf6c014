package sandbox

import (
	"errors"
	"strings"
	"testing"
)

// dockerMask is DefaultCaps as /proc/PID/status shows it in any Docker
// container.
const dockerMask CapSet = 0xa80425fb

func TestDefaultCapsAreDockers(t *testing.T) {
	if defaultCapSet != dockerMask {
		t.Fatalf("default set %s, want Docker's %s", defaultCapSet, dockerMask)
	}
	if got := strings.Join(dockerMask.Names(), ","); got != "CAP_CHOWN,CAP_DAC_OVERRIDE,CAP_FOWNER,CAP_FSETID,CAP_KILL,CAP_SETGID,CAP_SETUID,CAP_SETPCAP,CAP_NET_BIND_SERVICE,CAP_NET_RAW,CAP_SYS_CHROOT,CAP_MKNOD,CAP_AUDIT_WRITE,CAP_SETFCAP" {
		t.Fatalf("names %s", got)
	}
}

func TestKeptCaps(t *testing.T) {
	tests := []struct {
		name    string
		iso     Isolation
		want    CapSet
		wantErr bool
	}{
		{"default", Isolation{}, dockerMask, false},
		{"fewer", Isolation{Caps: []string{"CAP_CHOWN", "kill"}}, 1<<0 | 1<<5, false},
		{"spelling", Isolation{Caps: []string{" cap_Net_Raw "}}, 1 << 13, false},
		{"more is refused", Isolation{Caps: []string{"CAP_CHOWN", "CAP_SYS_ADMIN"}}, 0, true},
		{"more with the server flag", Isolation{Caps: []string{"CAP_SYS_ADMIN"}, AllowExtraCaps: true}, 1 << 21, false},
		{"unknown name", Isolation{Caps: []string{"CAP_FLY"}, AllowExtraCaps: true}, 0, true},
		{"unhardened keeps all", Isolation{Unhardened: true, Caps: []string{"CAP_CHOWN"}}, allCaps(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.iso.KeptCaps()
			if tt.wantErr {
				if !errors.Is(err, ErrIsolation) {
					t.Fatalf("got %s, %v; want an ErrIsolation", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %s, %v; want %s", got, err, tt.want)
			}
		})
	}
}

const hardenedStatus = `Name:	arbor-init
Umask:	0022
State:	S (sleeping)
NSpid:	4242	1
CapInh:	00000000a80425fb
CapPrm:	00000000a80425fb
CapEff:	00000000a80425fb
CapBnd:	00000000a80425fb
CapAmb:	0000000000000000
NoNewPrivs:	1
Seccomp:	2
Seccomp_filters:	1
Speculation_Store_Bypass:	thread vulnerable
`

func TestParseTaskIsolation(t *testing.T) {
	hardened := TaskIsolation{CapInh: dockerMask, CapPrm: dockerMask, CapEff: dockerMask, CapBnd: dockerMask, NoNewPrivs: 1, Seccomp: 2, SeccompFilters: 1}
	tests := []struct {
		name    string
		status  string
		want    TaskIsolation
		wantErr string
	}{
		{"hardened", hardenedStatus, hardened, ""},
		{"unhardened", "CapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n",
			TaskIsolation{CapPrm: 0x1ffffffffff, CapEff: 0x1ffffffffff, CapBnd: 0x1ffffffffff}, ""},
		{"old kernel without Seccomp_filters", strings.Replace(hardenedStatus, "Seccomp_filters:\t1\n", "", 1), TaskIsolation{}, "Seccomp_filters"},
		{"no caps at all", "Name:\tx\n", TaskIsolation{}, "CapAmb, CapBnd, CapEff, CapInh, CapPrm, NoNewPrivs, Seccomp, Seccomp_filters"},
		{"garbled mask", strings.Replace(hardenedStatus, "CapEff:\t00000000a80425fb", "CapEff:\tzz", 1), TaskIsolation{}, "CapEff"},
		{"short mask", strings.Replace(hardenedStatus, "CapEff:\t00000000a80425fb", "CapEff:\ta80425fb", 1), TaskIsolation{}, "CapEff"},
		{"garbled number", strings.Replace(hardenedStatus, "NoNewPrivs:\t1", "NoNewPrivs:\tyes", 1), TaskIsolation{}, "NoNewPrivs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTaskIsolation([]byte(tt.status))
			if tt.wantErr != "" {
				if !errors.Is(err, ErrIsolation) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want an ErrIsolation naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func hardenedRecord() IsolationRecord {
	task := TaskIsolation{CapInh: dockerMask, CapPrm: dockerMask, CapEff: dockerMask, CapBnd: dockerMask, NoNewPrivs: 1, Seccomp: 2, SeccompFilters: 1}
	return IsolationRecord{Hardened: true, Caps: dockerMask, Init: task, ShellPID: 2, Shell: task}
}

func TestCheckPolicy(t *testing.T) {
	fewer := CapSet(1<<0 | 1<<5)
	tests := []struct {
		name    string
		rec     func(r *IsolationRecord)
		policy  Isolation
		wantErr string
	}{
		{"hardened default", func(r *IsolationRecord) {}, Isolation{}, ""},
		{"task with fewer caps", func(r *IsolationRecord) {
			r.Caps = fewer
			r.Init.CapInh, r.Init.CapPrm, r.Init.CapEff, r.Init.CapBnd = fewer, fewer, fewer, fewer
			r.Shell = r.Init
		}, Isolation{}, ""},
		{"shell dropped some itself", func(r *IsolationRecord) { r.Shell.CapEff, r.Shell.CapPrm = 1, 1 }, Isolation{}, ""},
		{"shell stacked a filter", func(r *IsolationRecord) { r.Shell.SeccompFilters = 2 }, Isolation{}, ""},
		{"no shell recorded", func(r *IsolationRecord) { r.ShellPID, r.Shell = 0, TaskIsolation{} }, Isolation{}, ""},
		{"unhardened record, hardened policy", func(r *IsolationRecord) { r.Hardened = false }, Isolation{}, "unhardened"},
		{"unhardened policy takes anything", func(r *IsolationRecord) { r.Hardened, r.Init = false, TaskIsolation{} }, Isolation{Unhardened: true}, ""},
		{"caps beyond the default", func(r *IsolationRecord) { r.Caps |= 1 << 21 }, Isolation{}, "CAP_SYS_ADMIN"},
		{"caps beyond the default, server allows", func(r *IsolationRecord) {
			r.Caps |= 1 << 21
			r.Init.CapInh, r.Init.CapPrm, r.Init.CapEff, r.Init.CapBnd = r.Caps, r.Caps, r.Caps, r.Caps
		}, Isolation{AllowExtraCaps: true}, ""},
		{"init holds more than recorded", func(r *IsolationRecord) { r.Init.CapEff |= 1 << 21 }, Isolation{}, "init: CapEff"},
		{"init holds less than recorded", func(r *IsolationRecord) { r.Init.CapBnd &^= 1 << 13 }, Isolation{}, "init: CapBnd"},
		{"ambient caps", func(r *IsolationRecord) { r.Init.CapAmb = 1 }, Isolation{}, "CapAmb"},
		{"no no_new_privs", func(r *IsolationRecord) { r.Shell.NoNewPrivs = 0 }, Isolation{}, "shell (pid 2): NoNewPrivs"},
		{"no seccomp", func(r *IsolationRecord) { r.Init.Seccomp, r.Init.SeccompFilters = 0, 0 }, Isolation{}, "Seccomp=0"},
		{"strict mode is not the filter", func(r *IsolationRecord) { r.Init.Seccomp = 1 }, Isolation{}, "Seccomp=1"},
		{"shell holds a cap init lacks", func(r *IsolationRecord) { r.Shell.CapEff |= 1 << 24 }, Isolation{}, "shell (pid 2): CapEff"},
		{"shell lost init's filter", func(r *IsolationRecord) { r.Init.SeccompFilters, r.Shell.SeccompFilters = 2, 1 }, Isolation{}, "seccomp filters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := hardenedRecord()
			tt.rec(&r)
			err := r.CheckPolicy(tt.policy)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrIsolation) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want an ErrIsolation naming %q", err, tt.wantErr)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	tests := []struct {
		name    string
		got     func(r *IsolationRecord)
		wantErr string
	}{
		{"identical", func(r *IsolationRecord) {}, ""},
		{"init lost a filter", func(r *IsolationRecord) { r.Init.SeccompFilters = 0; r.Init.Seccomp = 0 }, "restored init"},
		{"init gained a cap", func(r *IsolationRecord) { r.Init.CapEff |= 1 << 21 }, "restored init"},
		{"init no_new_privs gone", func(r *IsolationRecord) { r.Init.NoNewPrivs = 0 }, "restored init"},
		{"shell differs", func(r *IsolationRecord) { r.Shell.CapBnd = allCaps() }, "restored shell"},
		{"shell missing", func(r *IsolationRecord) { r.ShellPID, r.Shell = 0, TaskIsolation{} }, "no shell with pid 2"},
		{"fewer filters is weaker too", func(r *IsolationRecord) { r.Shell.SeccompFilters = 0 }, "restored shell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := hardenedRecord()
			got := hardenedRecord()
			tt.got(&got)
			err := want.Matches(got)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrIsolation) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want an ErrIsolation naming %q", err, tt.wantErr)
			}
		})
	}
	t.Run("dump without a shell checks init only", func(t *testing.T) {
		want := hardenedRecord()
		want.ShellPID, want.Shell = 0, TaskIsolation{}
		if err := want.Matches(hardenedRecord()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestIsolationRecordFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadIsolationRecord(dir); !errors.Is(err, ErrIsolation) {
		t.Fatalf("image without a record: %v, want ErrIsolation", err)
	}
	want := hardenedRecord()
	if err := WriteIsolationRecord(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadIsolationRecord(dir)
	if err != nil || got != want {
		t.Fatalf("read back %+v, %v; want %+v", got, err, want)
	}
}
