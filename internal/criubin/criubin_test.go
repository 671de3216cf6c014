package criubin

import (
	"errors"
	"os/exec"
	"testing"
)

func TestResolve(t *testing.T) {
	onPath := func(string) (string, error) { return "/usr/sbin/criu", nil }
	noPath := func(string) (string, error) { return "", exec.ErrNotFound }
	tests := []struct {
		name     string
		flag     string
		existing map[string]bool
		lookPath func(string) (string, error)
		want     string
		wantErr  error
	}{
		{name: "flag wins", flag: "/x/criu", existing: map[string]bool{"/x/criu": true, Private: true}, lookPath: onPath, want: "/x/criu"},
		{name: "flag missing", flag: "/x/criu", existing: map[string]bool{Private: true}, lookPath: onPath, wantErr: ErrNotFound},
		{name: "private before PATH", existing: map[string]bool{Private: true}, lookPath: onPath, want: Private},
		{name: "PATH last", lookPath: onPath, want: "/usr/sbin/criu"},
		{name: "nothing", lookPath: noPath, wantErr: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(tt.flag, func(p string) bool { return tt.existing[p] }, tt.lookPath)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		name         string
		out          string
		major, minor int
		wantErr      bool
	}{
		{name: "trixie", out: "Version: 4.1.1\n", major: 4, minor: 1},
		{name: "bookworm", out: "Version: 3.17.1\n", major: 3, minor: 17},
		{name: "git build", out: "Version: 4.0\nGitID: v4.0-12-gabc\n", major: 4, minor: 0},
		{name: "garbage", out: "criu: error while loading shared libraries", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			major, minor, err := ParseVersion(tt.out)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if major != tt.major || minor != tt.minor {
				t.Fatalf("got %d.%d, want %d.%d", major, minor, tt.major, tt.minor)
			}
		})
	}
}
