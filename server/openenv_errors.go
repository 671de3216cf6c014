package server

import (
	"net/http"
	"strconv"

	"github.com/arbor-env/arbor/server/protocol"
)

// OpenEnv's error codes (WSErrorCode of its server, openenv/core/
// env_server/types.py): what its clients show as "(code: CODE)".
const (
	oeInvalidJSON     = "INVALID_JSON"
	oeUnknownType     = "UNKNOWN_TYPE"
	oeValidationError = "VALIDATION_ERROR"
	oeExecutionError  = "EXECUTION_ERROR"
	oeCapacityReached = "CAPACITY_REACHED"
	oeSessionError    = "SESSION_ERROR"
)

// JSON-RPC 2.0's error codes, for the "mcp" message.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcMethodNotFound = -32601
	rpcInvalidParams  = -32602
	rpcInternalError  = -32603
	rpcServerError    = -32000
)

// oeCode is how the OpenEnv endpoint words one of protocol v1's codes on
// each of its wires: the websocket's error code, the JSON-RPC code of an
// "mcp" answer, the HTTP status of the HTTP routes.
type oeCode struct {
	ws   string
	rpc  int
	http int
}

// oeCodes is the one table from v1's codes (protocol.ErrorOf's, itself
// the one table from errors to codes) to the endpoint's. A code it lacks
// is an infra failure (EXECUTION_ERROR, internal) or, when not infra, an
// execution error of the request (EXECUTION_ERROR, server error, 400).
var oeCodes = map[string]oeCode{
	protocol.CodeMalformed:         {oeInvalidJSON, rpcParseError, http.StatusBadRequest},
	protocol.CodeUnknownMethod:     {oeUnknownType, rpcMethodNotFound, http.StatusNotFound},
	protocol.CodeInvalidParams:     {oeValidationError, rpcInvalidParams, http.StatusUnprocessableEntity},
	protocol.CodeTooLarge:          {oeValidationError, rpcInvalidRequest, http.StatusRequestEntityTooLarge},
	protocol.CodeBadRequest:        {oeExecutionError, rpcServerError, http.StatusConflict},
	protocol.CodeUnauthorized:      {oeSessionError, rpcServerError, http.StatusUnauthorized},
	protocol.CodeUnknownEnv:        {oeSessionError, rpcServerError, http.StatusNotFound},
	protocol.CodeUnknownState:      {oeExecutionError, rpcInvalidParams, http.StatusNotFound},
	protocol.CodeUnknownTask:       {oeSessionError, rpcServerError, http.StatusNotFound},
	protocol.CodeTooManyReqs:       {oeCapacityReached, rpcServerError, http.StatusTooManyRequests},
	protocol.CodeTooManyEnvs:       {oeCapacityReached, rpcServerError, http.StatusTooManyRequests},
	protocol.CodeOverBudget:        {oeCapacityReached, rpcServerError, http.StatusTooManyRequests},
	protocol.CodeShuttingDown:      {oeSessionError, rpcServerError, http.StatusServiceUnavailable},
	protocol.CodeNoSpace:           {oeCapacityReached, rpcInternalError, http.StatusServiceUnavailable},
	protocol.CodeNodeUnavailable:   {oeSessionError, rpcInternalError, http.StatusServiceUnavailable},
	protocol.CodeEnvError:          {oeExecutionError, rpcServerError, http.StatusConflict},
	protocol.CodeVerifierError:     {oeExecutionError, rpcServerError, http.StatusConflict},
	protocol.CodeUnrestorableState: {oeExecutionError, rpcServerError, http.StatusConflict},
}

// oeCodeOf is pe's row of oeCodes.
func oeCodeOf(pe *protocol.Error) oeCode {
	if c, ok := oeCodes[pe.Code]; ok {
		return c
	}
	if pe.Infra {
		return oeCode{oeExecutionError, rpcInternalError, http.StatusInternalServerError}
	}
	return oeCode{oeExecutionError, rpcServerError, http.StatusBadRequest}
}

// oeErrorData is the data of an error answer: OpenEnv's {message, code}
// and v1's code (arbor_code) and flags, so that nothing of v1's is lost.
func oeErrorData(pe *protocol.Error) map[string]any {
	d := map[string]any{"message": pe.Message, "code": oeCodeOf(pe).ws, "arbor_code": pe.Code, "retryable": pe.Retryable, "infra": pe.Infra}
	if pe.RetryAfterMS > 0 {
		d["retry_after_ms"] = pe.RetryAfterMS
	}
	return d
}

// setRetryAfter sets the Retry-After header (whole seconds, at least 1)
// of an HTTP answer of pe when pe carries a retry hint (a busy answer of
// admission control; docs/openenv.md).
func setRetryAfter(w http.ResponseWriter, pe *protocol.Error) {
	if pe.RetryAfterMS > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt((pe.RetryAfterMS+999)/1000, 10))
	}
}
