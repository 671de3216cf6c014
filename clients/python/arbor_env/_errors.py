from typing import Any, List, Optional


class ArborError(Exception):
    """An error the server (or the connection to it) reported.

    code is one of protocol v1's error codes ("unknown_env", "invalid_params",
    "restore_failed", ...) or one of the client's own ("connection_closed",
    "client_timeout", "bad_response", "bad_url"). retryable says the same request may
    succeed later *and* that sending it again is safe. infra marks a failure
    of Arbor itself rather than of the request or the agent: trainers should
    mask such episodes instead of scoring them. retry_after, when the server
    sent one (a too_many_requests of its admission control), is how many
    seconds it suggests waiting before sending the request again.
    """

    def __init__(self, code: str, message: str, retryable: bool = False, infra: bool = False,
                 retry_after: Optional[float] = None) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.retryable = retryable
        self.infra = infra
        # Seconds the server suggests waiting before a retry (its
        # retry_after_ms: a busy answer of its admission control), or None.
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return "ArborError(%r, %r, retryable=%r, infra=%r)" % (self.code, self.message, self.retryable, self.infra)


class ConnectionClosedError(ArborError):
    """The websocket closed (or never opened) before the call had its answer.

    sent says whether the request had been written to the socket: one that
    was not never reached the server, so it is retryable; one that was may
    have run there, and is retryable only when the call is idempotent (a
    step with a request key, a read). The client's automatic reconnect
    retries exactly those."""

    def __init__(self, message: str, retryable: bool = True, sent: bool = False) -> None:
        super().__init__("connection_closed", message, retryable=retryable, infra=True)
        self.sent = sent


class BadURLError(ArborError):
    """The URL does not lead to a protocol v1 endpoint: a scheme other than
    ws:// or wss:// (an http:// URL), or a server that answered the
    websocket handshake with an HTTP status instead of an upgrade (a wrong
    path: 404, a web page: 200). Sending again cannot help, and it is the
    caller's mistake, not Arbor's: retryable and infra are false, so the
    client fails at once instead of reconnecting, and a trainer stops
    instead of masking. A refused connection (no server listening yet) is
    a ConnectionClosedError instead: retryable infra."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__("bad_url", "%s: %s; Arbor's protocol v1 endpoint is ws://HOST:PORT/v1/ws (wss:// behind TLS)"
                         % (url, reason), retryable=False, infra=False)
        self.url = url


class ClientTimeoutError(ArborError):
    """The client stopped waiting for an answer (its timeout). The request
    may still run on the server: retryable is true only when repeating it
    is safe (an idempotent call; for a step, one with a request key: pass
    request_key back as step(..., key=...) and the server answers the
    recorded result instead of running the command twice)."""

    def __init__(self, message: str, retryable: bool, request_key: Optional[str] = None) -> None:
        super().__init__("client_timeout", message, retryable=retryable, infra=True)
        self.request_key = request_key


class BadResponseError(ArborError):
    """The server's answer does not have the shape protocol v1 gives it
    (a field missing or of the wrong type). Not retryable; infra."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_response", message, retryable=False, infra=True)


class BranchError(ArborError):
    """Some children of a branch could not be made.

    envs holds one entry per requested child: an Env, or None where that
    child failed; errors holds the matching ArborError or None. The children
    that were made are open: close them or use them.
    """

    def __init__(self, envs: List[Any], errors: List[Optional[ArborError]]) -> None:
        failed = [e for e in errors if e is not None]
        first = failed[0]
        super().__init__(first.code, "%d of %d children failed; first: %s" % (len(failed), len(errors), first.message),
                         first.retryable, infra=first.infra)
        self.envs = envs
        self.errors = errors
