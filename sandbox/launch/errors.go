package launch

import "errors"

// ErrQuotaNotSet: a sandbox root's disk quota did not show after it was
// set, so the root is not handed out.
var ErrQuotaNotSet = errors.New("disk quota not in effect")
