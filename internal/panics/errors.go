package panics

import "errors"

// ErrPanic is wrapped by the error a recovered panic becomes; test with
// errors.Is. The panic's value is in the message only: a value that is
// itself an error (context.Canceled, say) must not make the request's
// answer anything but internal.
var ErrPanic = errors.New("panic serving the request")
