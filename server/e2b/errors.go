package e2b

import (
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/arbor-env/arbor/state"
)

// Errors of the E2B surface, each a sentinel of one of state's categories.
var (
	// ErrUnknownSandbox: no sandbox of the request's tenant has that id
	// (another tenant's answers the same).
	ErrUnknownSandbox = state.New(state.ErrNotFound, "unknown sandbox")
	// ErrNoSandboxHeader: an envd request without the E2b-Sandbox-Id
	// header.
	ErrNoSandboxHeader = state.New(state.ErrInvalid, "no E2b-Sandbox-Id header")
	// ErrPaused: the sandbox is paused; connect (resume) it first.
	ErrPaused = state.New(state.ErrUnavailable, "sandbox is paused")
	// ErrUnknownFile: a path that does not exist in the sandbox.
	ErrUnknownFile = state.New(state.ErrNotFound, "no such file or directory")
	// ErrExists: make_dir of a path that exists.
	ErrExists = state.New(state.ErrInvalid, "path exists")
	// ErrUnknownProcess: no running command has that pid.
	ErrUnknownProcess = state.New(state.ErrNotFound, "no running command with that pid")
	// ErrNotImplemented: a call of the E2B API this server does not serve
	// (docs/e2b.md lists them).
	ErrNotImplemented = errors.New("not implemented by Arbor's E2B API (docs/e2b.md)")
)

// The one table from errors to the E2B wire: an HTTP status for the REST
// and files routes (the SDK's handleApiError and its envd map: 404 to
// NotFoundError and its kinds, 400 to InvalidArgumentError, 401 to
// AuthenticationError, 429 to RateLimitError, 502 to TimeoutError) and a
// Connect code for the RPCs (NotFound, InvalidArgument, Unavailable...).
var wireCodes = []struct {
	err  error
	http int
	rpc  connect.Code
}{
	{ErrNotImplemented, http.StatusNotImplemented, connect.CodeUnimplemented},
	{ErrExists, http.StatusConflict, connect.CodeAlreadyExists},
	{ErrPaused, http.StatusBadGateway, connect.CodeUnavailable},
	{state.ErrNotFound, http.StatusNotFound, connect.CodeNotFound},
	{state.ErrInvalid, http.StatusBadRequest, connect.CodeInvalidArgument},
	{state.ErrQuota, http.StatusTooManyRequests, connect.CodeResourceExhausted},
	{state.ErrBusy, http.StatusConflict, connect.CodeAborted},
	{state.ErrUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable},
}

// httpStatus is err's HTTP status on the E2B wire.
func httpStatus(err error) int {
	for _, c := range wireCodes {
		if errors.Is(err, c.err) {
			return c.http
		}
	}
	return http.StatusInternalServerError
}

// rpcError is err as a Connect error.
func rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	for _, c := range wireCodes {
		if errors.Is(err, c.err) {
			return connect.NewError(c.rpc, err)
		}
	}
	return connect.NewError(connect.CodeInternal, err)
}

// writeError answers err as the E2B API's Error body {code, message}
// (the SDK reads code 404 as not found, 409 on pause as already paused).
func writeError(w http.ResponseWriter, err error) {
	code := httpStatus(err)
	writeJSON(w, code, map[string]any{"code": code, "message": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
