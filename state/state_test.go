package state

import (
	"errors"
	"fmt"
	"testing"
)

func TestKindJoin(t *testing.T) {
	for _, c := range []struct{ a, b, want Kind }{
		{None, None, None}, {None, FS, FS}, {FS, None, FS}, {FS, Proc, Full},
		{Proc, Proc, Proc}, {Full, None, Full}, {Proc, Full, Full},
	} {
		if got := c.a.Join(c.b); got != c.want {
			t.Errorf("%s.Join(%s) = %s, want %s", c.a, c.b, got, c.want)
		}
	}
	if !Full.Has(FS) || !Full.Has(Proc) || FS.Has(Proc) || None.Has(FS) {
		t.Error("Has is wrong")
	}
	if Kind("partial").Valid() || !Proc.Valid() {
		t.Error("Valid is wrong")
	}
}

func TestErrorf(t *testing.T) {
	inner := errors.New("disk on fire")
	err := Errorf(ErrInvalidParams, "data: want %s (%w)", "a string", inner)
	if err.Error() != "data: want a string (disk on fire)" {
		t.Errorf("text %q: the kind's text must not be added", err)
	}
	for _, target := range []error{ErrInvalidParams, ErrInvalid, inner} {
		if !errors.Is(err, target) {
			t.Errorf("%v is not %v", err, target)
		}
	}
	if errors.Is(err, ErrNotFound) {
		t.Error("an invalid params error is not found")
	}
	wrapped := fmt.Errorf("step: %w", ErrCheckpoint)
	if !errors.Is(wrapped, ErrUnrestorable) || errors.Is(wrapped, ErrRestore) {
		t.Error("precise sentinels must sit in their category only")
	}
}

func TestNewID(t *testing.T) {
	a, b := NewID("s"), NewID("s")
	if a == b || len(a) != 13 || a[0] != 's' {
		t.Errorf("ids %q %q", a, b)
	}
}
