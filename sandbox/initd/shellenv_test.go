package initd

import (
	"slices"
	"testing"
)

func TestShellEnv(t *testing.T) {
	def := []string{"PATH=" + defaultPath, "HOME=/root", "TERM=dumb", "LANG=C.UTF-8", "PS1=", "PS2=", "SHELL=/bin/sh"}
	tests := []struct {
		name  string
		extra []string
		want  []string
	}{
		{"none", nil, def},
		{"added", []string{"FOO=bar"}, append(slices.Clone(def), "FOO=bar")},
		{"a default replaced", []string{"PATH=/opt/bin", "HOME=/home/u"},
			[]string{"TERM=dumb", "LANG=C.UTF-8", "PS1=", "PS2=", "SHELL=/bin/sh", "PATH=/opt/bin", "HOME=/home/u"}},
		{"the last of a key counts", []string{"A=1", "B=2", "A=3"}, append(slices.Clone(def), "B=2", "A=3")},
		{"empty value", []string{"LANG="}, []string{"PATH=" + defaultPath, "HOME=/root", "TERM=dumb", "PS1=", "PS2=", "SHELL=/bin/sh", "LANG="}},
		{"= in the value", []string{"X=a=b"}, append(slices.Clone(def), "X=a=b")},
		{"no = is dropped", []string{"X"}, def},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := shellEnv("/bin/sh", tt.extra); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
