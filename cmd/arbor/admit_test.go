package main

import (
	"strings"
	"testing"

	"github.com/arbor-env/arbor/coordinator"
)

// TestAdmitSlotsFlag: --admit-slots' CLASS=N items set each class; an
// unknown class, a missing or non-positive N are refused naming the item.
func TestAdmitSlotsFlag(t *testing.T) {
	tests := []struct {
		name    string
		items   []string
		want    coordinator.Slots
		wantErr string
	}{
		{name: "none", want: coordinator.Slots{}},
		{name: "every class", items: []string{"reset=1", "step=32", "branch=4", "evaluate=2"},
			want: coordinator.Slots{Reset: 1, Step: 32, Branch: 4, Evaluate: 2}},
		{name: "unknown class", items: []string{"turn=3"}, wantErr: `no class "turn"`},
		{name: "no number", items: []string{"step"}, wantErr: "want CLASS=N"},
		{name: "zero", items: []string{"step=0"}, wantErr: "want CLASS=N"},
		{name: "not a number", items: []string{"step=many"}, wantErr: "want CLASS=N"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := admitSlots(tt.items)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("admitSlots(%q): %v, want an error with %q", tt.items, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("admitSlots(%q) = %+v, %v; want %+v", tt.items, got, err, tt.want)
			}
		})
	}
}
