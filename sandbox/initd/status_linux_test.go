package initd

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadStatusKeepsOnlyTheShell: of the bytes on the status socket,
// only those the shell's pid wrote count; the kernel's credentials decide.
func TestReadStatusKeepsOnlyTheShell(t *testing.T) {
	tests := []struct {
		name     string
		shellPID int
		wantKept bool
	}{
		{name: "written by the shell", shellPID: os.Getpid(), wantKept: true},
		{name: "written by another process", shellPID: os.Getpid() + 1, wantKept: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &shell{stR: -1, buf: make([]byte, 4096), pid: tt.shellPID}
			peer, err := s.newStatusSocket()
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(peer)
			defer unix.Close(s.stR)
			rec := "\036" + newNonce() + " 1 0 /\036"
			if _, err := unix.Write(peer, []byte(rec)); err != nil {
				t.Fatal(err)
			}
			s.readStatus()
			if kept := string(s.status) == rec; kept != tt.wantKept || (tt.wantKept == (s.rejected != 0)) {
				t.Errorf("status %q, rejected %d; want kept=%v", s.status, s.rejected, tt.wantKept)
			}
		})
	}
}
