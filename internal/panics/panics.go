package panics

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// Error is a recovered panic.
type Error struct {
	Value any    // what was passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %v", ErrPanic, e.Value) }

// Unwrap makes errors.Is(err, ErrPanic) hold, and only that.
func (e *Error) Unwrap() error { return ErrPanic }

// Recover stops a panic of the calling goroutine, logs it with its stack
// at level error (with attrs: the method, the env), and sets *err to an
// *Error. It must be deferred directly (defer panics.Recover(log, &err)):
// recover stops a panic only when called by the deferred function
// itself. Without a panic it does nothing.
func Recover(log *slog.Logger, err *error, attrs ...slog.Attr) {
	r := recover()
	if r == nil {
		return
	}
	*err = recovered(log, r, attrs)
}

// recovered logs the panic r and returns it as an *Error.
func recovered(log *slog.Logger, r any, attrs []slog.Attr) *Error {
	e := &Error{Value: r, Stack: debug.Stack()}
	if log == nil {
		log = slog.Default()
	}
	args := make([]any, 0, len(attrs)+2)
	for _, a := range attrs {
		args = append(args, a)
	}
	args = append(args, slog.String("panic", fmt.Sprint(r)), slog.String("stack", string(e.Stack)))
	log.Error("panic serving a request: answered internal, the server goes on", args...)
	return e
}

// Call runs fn and returns its error, or the *Error of a panic in it
// (logged, as by Recover).
func Call(log *slog.Logger, fn func() error, attrs ...slog.Attr) (err error) {
	defer Recover(log, &err, attrs...)
	return fn()
}

// Handler serves h and answers a request whose handler panicked with
// 500, logged as by Recover. A handler that has already answered (or
// taken over the connection, as a websocket does) keeps its answer: the
// 500 then goes nowhere, and the websocket handlers recover each message
// themselves. http.ErrAbortHandler, the deliberate abort of a response,
// is passed on to net/http.
func Handler(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			recovered(log, v, []slog.Attr{slog.String("http", r.Method+" "+r.URL.Path)})
			http.Error(w, "internal error (logged on the server)", http.StatusInternalServerError)
		}()
		h.ServeHTTP(w, r)
	})
}
