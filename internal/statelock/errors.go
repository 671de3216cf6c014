package statelock

import (
	"errors"
	"fmt"
)

// ErrHeld is wrapped by the error of Acquire when another process holds
// the lock (a *HeldError says which).
var ErrHeld = errors.New("state dir in use")

// HeldError says which process holds a state dir's lock.
type HeldError struct {
	Dir string
	PID int // 0: the holder has not written its pid yet
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = fmt.Sprintf("pid %d", e.PID)
	}
	return fmt.Sprintf("%s: %s holds %s/%s (another arbor serve on this state dir, perhaps still stopping)", ErrHeld, who, e.Dir, FileName)
}

func (e *HeldError) Unwrap() error { return ErrHeld }
