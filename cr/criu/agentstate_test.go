package criu

import "testing"

// TestParseGhostFailure: the log lines CRIU 4.x writes when a held
// deleted file is over the ghost limit are read into path, size and pid;
// other failures are not blamed on the sandbox.
func TestParseGhostFailure(t *testing.T) {
	tests := []struct {
		name string
		log  string
		want ghostFailure
		ok   bool
	}{
		{name: "ghost over the limit", log: `Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
Error (criu/files-reg.c:1031): Can't dump ghost file /tmp/g of 2097152 size, increase limit
Error (criu/cr-dump.c:1545): Dump files (pid: 15181) failed with -1
Error (criu/cr-dump.c:1975): Dumping FAILED.`, want: ghostFailure{path: "/tmp/g", size: 2097152, pid: 15181}, ok: true},
		{name: "a path with spaces", log: "Error (criu/files-reg.c:1031): Can't dump ghost file /work/a b of 70000000 size, increase limit\n",
			want: ghostFailure{path: "/work/a b", size: 70000000}, ok: true},
		{name: "another failure", log: `Error (criu/cr-dump.c:1545): Dump files (pid: 15181) failed with -1
Error (criu/cr-dump.c:1975): Dumping FAILED.`},
		{name: "empty", log: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseGhostFailure([]byte(tt.log))
			if ok != tt.ok || (ok && got != tt.want) {
				t.Errorf("parseGhostFailure = %+v %v, want %+v %v", got, ok, tt.want, tt.ok)
			}
		})
	}
	if !quotaInRestore([]byte("Error (criu/files-reg.c:800): Can't write ghost: Disk quota exceeded")) || quotaInRestore([]byte("No space left on device")) {
		t.Error("quotaInRestore: only EDQUOT is the sandbox's own quota")
	}
	if !ghostPathBlocked([]byte("             1: Error (criu/files-reg.c:467): Can't create ghost regfile: Not a directory")) ||
		ghostPathBlocked([]byte("Error (criu/files-reg.c:467): Can't create ghost regfile: No space left on device")) {
		t.Error("ghostPathBlocked: only a ghost's path that is not a directory is the sandbox's doing")
	}
}
